"""Training time of the tiny transformer (course/tiny_transformer.py) with the committed recipe.

Trains make_model(0) exactly as `python -m course.tiny_transformer train` does (2,500 steps of
batch 32, the first 1,000 on 2-fact examples; one thread, deterministic algorithms), prints the
wall and CPU time, the time per step of each curriculum phase, the held-out accuracy, and whether
the weights are bit-identical to the committed checkpoint course/checkpoints/likesworld.pt.

Wall time depends on what else runs on the machine: the CPU time of this process is printed
beside it (one thread, so CPU time ≈ wall time on an idle machine).

Run: python -m benchmarks bench_training  (or make bench)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from course import likesworld  # noqa: E402
from course.tiny_transformer import EASY_STEPS, TRAIN_STEPS, load_checkpoint, make_model, train  # noqa: E402


def main() -> None:
    torch.set_num_threads(1)      # training sets this itself; the evaluation below too
    model = make_model(0)
    stamps: list[float] = []                      # wall clock after each step
    start, cpu = time.perf_counter(), time.process_time()
    train(model, on_step=lambda _loss: stamps.append(time.perf_counter()))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    easy, full = stamps[EASY_STEPS - 1] - start, stamps[-1] - stamps[EASY_STEPS - 1]
    committed = load_checkpoint()
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), committed.state_dict().values()))
    print(f"training: {TRAIN_STEPS} steps in {wall:.1f} s wall, {cpu:.1f} s CPU (torch {torch.__version__}, 1 thread)")
    print(f"  steps 1-{EASY_STEPS} (2 facts):         {1e3 * easy / EASY_STEPS:.1f} ms/step")
    print(f"  steps {EASY_STEPS + 1}-{TRAIN_STEPS} (2..6 facts): {1e3 * full / (TRAIN_STEPS - EASY_STEPS):.1f} ms/step")
    print(f"held-out accuracy {likesworld.evaluate(model, 'test'):.1%}; "
          f"bit-identical to the committed checkpoint: {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
