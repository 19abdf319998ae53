#!/usr/bin/env python3
"""Build the tiny random-weight Llama model that the vLLM CPU engine serves in tests.

Run it with the engine venv's python (it needs torch, transformers and tokenizers):

    .engine/venv/bin/python scripts/build_tiny_model.py

It writes ``<engine dir>/models/tiny-llama`` (engine dir: ``$AGENTRT_ENGINE_DIR`` or
``<repo>/.engine``): a 2-layer Llama (hidden 256, 4 heads, intermediate 512, vocabulary 8192,
bf16) with random weights drawn from a fixed seed, and a byte-level BPE tokenizer trained
offline on the Python standard library's sources, saved with a chat template so that
``/v1/chat/completions`` works. Nothing is downloaded. The outputs are random tokens; timings,
batching, prefix caching, priorities and metrics are real.

Idempotent: when the folder holds a build of the same recipe it returns at once, before importing
any heavy module. ``--force`` rebuilds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

# Everything that changes the output belongs here: a change rebuilds the model.
RECIPE: dict[str, object] = {
    "recipe_version": 1,
    "architecture": "LlamaForCausalLM",
    "hidden_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "intermediate_size": 512,
    "vocab_size": 8192,
    "max_position_embeddings": 8192,
    "dtype": "bfloat16",
    "seed": 1234,
    "tokenizer": "byte-level-bpe",
    "tokenizer_corpus_bytes": 6_000_000,
}

STAMP_NAME = ".agentrt-build.json"

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, "<|start_header_id|>", "<|end_header_id|>", EOT, PAD]

# Llama-3 style template. add_generation_prompt opens the assistant turn.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set content = message['content'] %}"
    "{% else %}{% set content = message['content'] | map(attribute='text') | join('') %}"
    "{% endif %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ content | trim }}<|eot_id|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


def default_out() -> Path:
    engine_dir = os.environ.get("AGENTRT_ENGINE_DIR") or str(repo_root() / ".engine")
    return Path(engine_dir) / "models" / "tiny-llama"


def is_built(out: Path) -> bool:
    stamp = out / STAMP_NAME
    if not stamp.is_file():
        return False
    try:
        data = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return False
    if data.get("recipe") != RECIPE:
        return False
    needed = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    return all((out / name).is_file() for name in needed)


def corpus_files(limit_bytes: int) -> list[str]:
    """A deterministic slice of the standard library's sources, about ``limit_bytes`` long."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files: list[str] = []
    total = 0
    for path in sorted(stdlib.rglob("*.py")):
        rel = path.relative_to(stdlib).parts
        if rel[0] in ("site-packages", "test", "idlelib", "lib2to3") or "tests" in rel:
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        files.append(str(path))
        total += size
        if total >= limit_bytes:
            break
    if total < limit_bytes // 4:
        raise SystemExit(f"too little local text to train the tokenizer in {stdlib}")
    return files


def build(out: Path) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")

    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    vocab_size = int(str(RECIPE["vocab_size"]))
    t0 = time.monotonic()

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".tmp-", dir=out.parent))
    try:
        # Tokenizer: byte-level BPE, exactly vocab_size entries including the special tokens.
        bpe = ByteLevelBPETokenizer()
        bpe.train(
            corpus_files(int(str(RECIPE["tokenizer_corpus_bytes"]))),
            vocab_size=vocab_size,
            min_frequency=2,
            special_tokens=SPECIAL_TOKENS,
            show_progress=False,
        )
        got = bpe.get_vocab_size()
        if got != vocab_size:
            raise SystemExit(f"tokenizer has {got} entries, wanted {vocab_size}")
        tokenizer = PreTrainedTokenizerFast(
            tokenizer_object=bpe,
            bos_token=BOS,
            eos_token=EOT,
            pad_token=PAD,
            additional_special_tokens=[EOS, "<|start_header_id|>", "<|end_header_id|>"],
            model_max_length=int(str(RECIPE["max_position_embeddings"])),
            chat_template=CHAT_TEMPLATE,
        )
        tokenizer.save_pretrained(str(tmp))
        t_tok = time.monotonic() - t0

        # Model: random weights from a fixed seed.
        torch.manual_seed(int(str(RECIPE["seed"])))
        config = LlamaConfig(
            vocab_size=vocab_size,
            hidden_size=RECIPE["hidden_size"],
            intermediate_size=RECIPE["intermediate_size"],
            num_hidden_layers=RECIPE["num_hidden_layers"],
            num_attention_heads=RECIPE["num_attention_heads"],
            num_key_value_heads=RECIPE["num_key_value_heads"],
            max_position_embeddings=RECIPE["max_position_embeddings"],
            bos_token_id=tokenizer.convert_tokens_to_ids(BOS),
            eos_token_id=[
                tokenizer.convert_tokens_to_ids(EOT),
                tokenizer.convert_tokens_to_ids(EOS),
            ],
            pad_token_id=tokenizer.convert_tokens_to_ids(PAD),
            tie_word_embeddings=False,
            torch_dtype="bfloat16",
        )
        model = LlamaForCausalLM(config).to(torch.bfloat16)
        model.save_pretrained(str(tmp), safe_serialization=True)
        model.generation_config.save_pretrained(str(tmp))

        stamp = {
            "recipe": RECIPE,
            "built_with": {
                "python": sys.version.split()[0],
                "torch": torch.__version__,
                "transformers": __import__("transformers").__version__,
                "tokenizers": __import__("tokenizers").__version__,
            },
            "seconds": {"tokenizer": round(t_tok, 2), "total": round(time.monotonic() - t0, 2)},
        }
        (tmp / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")

        # mkdtemp makes a private folder; the model is not secret.
        tmp.chmod(0o755)
        for child in tmp.iterdir():
            child.chmod(0o644)
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"built {out} in {time.monotonic() - t0:.1f} s (tokenizer {t_tok:.1f} s)", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--force", action="store_true", help="rebuild even if up to date")
    args = parser.parse_args(argv)
    out: Path = args.out or default_out()
    if not args.force and is_built(out):
        print(f"up to date: {out}", flush=True)
        return 0
    build(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
