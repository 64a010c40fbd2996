"""Disk use of a live-checked capture (capture(..., reference=)): a torch MLP (64 -> 256 -> 64, fp32) trained 20
steps with AdamW, captured as the reference (digest, fast hash), captured in full, and captured again with the
learning rate changed at step --change-at, checked against the reference. Prints the three trees' sizes and
where the checked capture first diverged.

    python3 scripts/live_check_disk.py [--change-at 7]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from harness.capture import capture

STEPS = 20


def train(path: Path, change_at: int | None = None, mode: str = "digest", widths: tuple[int, int, int] = (64, 256, 64),
          rows: int = 32, **live) -> None:
    """An MLP (widths: in, hidden, out) trained STEPS steps with AdamW on fixed batches of `rows` rows, captured
    at `path` (hash "fast"; `live`: reference=, map=, on_divergence=); from step `change_at` on, another
    learning rate. tests/test_capture_live.py trains with it too."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(widths[0], widths[1]), torch.nn.ReLU(), torch.nn.Linear(widths[1], widths[2]))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = torch.Generator().manual_seed(1)
    with capture(model, path, mode=mode, hash="fast", optimizer=opt, **live) as cap:
        for step in range(STEPS):
            if step == change_at:
                opt.param_groups[0]["lr"] = 2e-3
            loss = model(torch.randn(rows, widths[0], generator=batches)).square().mean()
            loss.backward()
            cap.loss(loss)
            opt.step()
            opt.zero_grad()


def size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--change-at", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train(root / "reference")
        train(root / "full", mode="full")
        train(root / "checked", change_at=args.change_at, reference=root / "reference")
        diverged = json.loads((root / "checked" / "capture.json").read_text())["diverged"]
        print(f"reference (digests, {STEPS} steps): {size(root / 'reference'):,} bytes; full capture: "
              f"{size(root / 'full') / STEPS:,.0f} bytes per step; live-checked capture: {size(root / 'checked'):,} bytes; "
              f"diverged: {diverged}")


if __name__ == "__main__":
    main()
