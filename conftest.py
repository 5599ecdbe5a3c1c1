"""pytest's settings that code must give, at the root so that they hold for
test_agent_loop.py run alone too:

- the tests' helper modules (in tests/) have their assertions rewritten as the tests' are,
  so that a broken rule fails with pytest's account of the values, not a bare
  AssertionError;
- a test that hangs fails: past setup.cfg's ``faulthandler_timeout`` the stack of every
  thread is written to standard error and the process exits. pytest's own faulthandler
  plugin only writes the stacks (and pytest 8, the last for Python 3.8, has no
  ``faulthandler_exit_on_timeout``), so the test would go on hanging CI.
"""

import faulthandler
import os
import sys
from typing import List

import pytest

pytest.register_assert_rewrite(
    "loop_invariants", "loop_reference", "loop_testing", "loop_testing_providers"
)

# A copy of standard error taken before pytest captures it for each test, so that the
# stacks of a hung test reach the terminal or the CI log rather than a capture's file.
_STDERR: List[int] = []


def pytest_configure(config: pytest.Config) -> None:
    _STDERR.append(os.dup((sys.__stderr__ or sys.stderr).fileno()))


def pytest_unconfigure(config: pytest.Config) -> None:
    os.close(_STDERR.pop())


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Arms the hang guard for this test's setup, call and teardown (pytest's faulthandler
    plugin disarms it when the test ends); it exits, where pytest's only writes."""
    timeout = float(item.config.getini("faulthandler_timeout") or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True, file=_STDERR[-1])
