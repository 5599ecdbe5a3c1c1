#!/usr/bin/env bash
# Installs Debian's chromium for tox's browser env (tests/test_agent_loop_view.py runs the
# page in it, headless), unless a chromium is already on PATH. Needs root and apt-get: the
# CI machine (.ci/run) is a fresh Debian where only what the repository installs exists.
set -euo pipefail
if command -v chromium >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "tests/install_chromium.sh: chromium is missing; install Debian's chromium" \
        "(apt-get install chromium, as root) to run tox -e browser" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends chromium >/dev/null
command -v chromium >/dev/null
