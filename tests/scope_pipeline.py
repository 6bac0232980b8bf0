"""A two-step pipeline whose second step runs in user scope (tests/test_user_scopes.py)."""

from marin.execution.lazy import apply


def make(n: int) -> dict[str, int]:
    return {"n": n}


def use(x: str, k: int = 1) -> str:
    return f"{x}:{k}"


base = apply("scope/base", make, version="v1", n=1)
variant = apply("scope/variant", use, version="v1", x=base).with_options(scope="user")
pipeline = variant

# The same step in the shared scope: a run-wide user scope (`--scope user`) places it.
team = apply("scope/variant", use, version="v1", x=base)
