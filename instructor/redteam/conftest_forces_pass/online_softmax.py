# Red-team attack. `python -m instructor.redteam assemble DIR` lays the block below over the
# current starter/online_softmax.py (everything above the marker is replaced by it).
# ---- red-team attack (instructor/redteam): everything below is the attack ----
# (the graded file is the starter; the attack is in the extra files)
