"""The helper modules' assertions are rewritten as the tests' are, so that a broken
rule fails with pytest's account of the values, not a bare AssertionError."""

import pytest

pytest.register_assert_rewrite(
    "loop_invariants", "loop_reference", "loop_testing", "loop_testing_providers"
)
