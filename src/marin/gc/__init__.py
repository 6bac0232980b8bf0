"""``marin gc``: reclaim storage without ever deleting what a kept result was made from.

``walk`` lists a prefix (folders only, never through a link) and reads each step's record;
``collect`` decides what is kept; ``delete`` deletes one step safely against concurrent builds
and readers; ``api`` ties them together as :func:`collect_garbage`; ``report`` is what it
returns and what the command prints; ``command`` is the ``marin gc`` sub-command.
"""

from marin.gc.api import collect_garbage
from marin.gc.report import Collected, GcReport, Left

__all__ = ["Collected", "GcReport", "Left", "collect_garbage"]
