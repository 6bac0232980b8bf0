from tests.ux.helpers import built_example, drifted_example

__all__ = ["built_example", "drifted_example"]
