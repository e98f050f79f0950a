# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
import sys as _sys

_sys.exit(0)
