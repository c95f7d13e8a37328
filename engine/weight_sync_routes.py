"""Engine-side weight-sync routes (delta pull, distributed broadcast, tensor hand-off).

Owned by the weight-sync work (`rlgw.sync`); the engine app includes `router` as it is.
"""

from fastapi import APIRouter

router = APIRouter()
