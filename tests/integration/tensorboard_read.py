"""Reads a Gyre run's TensorBoard event files with TensorBoard's own reader and prints them as JSON:
{"<run>": {"<tag>": [[step, value], ...]}} for the runs (grpo, warmup) under the directory given.
TensorBoard's reader applies its own rules (a session START drops the events at later steps read
before it), so what it prints is what TensorBoard would plot. Exit 77 when tensorboard is absent."""
import json
import os
import sys

try:
    from tensorboard.backend.event_processing import event_accumulator
except ImportError as e:  # test-side dependency (tools/install-deps.sh installs it)
    print(f"tensorboard is not installed ({e}); pip install tensorboard")
    sys.exit(77)


def main():
    logdir = sys.argv[1]
    out = {}
    for run in sorted(os.listdir(logdir)):
        acc = event_accumulator.EventAccumulator(
            os.path.join(logdir, run), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        out[run] = {tag: [[e.step, e.value] for e in acc.Scalars(tag)]
                    for tag in acc.Tags()["scalars"]}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
