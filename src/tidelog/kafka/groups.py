"""(placeholder: filled by its own change)"""

from __future__ import annotations

from typing import Any

SERVED: tuple[tuple[int, str, int, int, Any], ...] = ()
