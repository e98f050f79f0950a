"""Course code for the FlashAttention lecture that is neither student work nor grading.

Modules: ``reference`` (trusted float64 attention math), ``counting`` (element-read counters),
``cost_model`` (GPU specs and the notes' roofline estimates), ``likesworld`` and
``tiny_transformer`` (data set and model), ``gpusim`` (the simulated GPU).
"""
