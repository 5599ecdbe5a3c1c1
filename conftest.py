"""pytest's settings that code must give: the tests' helper modules (in tests/) have their
assertions rewritten as the tests' are, so that a broken rule fails with pytest's account
of the values, not a bare AssertionError. At the root, so that it holds for
test_agent_loop.py run alone too."""

import pytest

pytest.register_assert_rewrite(
    "loop_invariants", "loop_reference", "loop_testing", "loop_testing_providers"
)
