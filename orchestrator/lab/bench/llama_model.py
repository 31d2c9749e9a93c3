"""A small llama model with random weights, written as GGUF, for the chat benchmark's real-compute backend.

No weights are downloaded anywhere: the model is made here, from a seed, with the `gguf` package (the
optional `bench` extra). Its answers are noise, but the work the engine does for them is real: prefill
and decode on this machine's CPU, in the same engine Ollama runs (llama.cpp), with its real slots, batching
and prompt cache. That is what the gate is measured against.

The vocabulary is SentencePiece-style with byte fallback (the 256 `<0xNN>` tokens), so any text
tokenizes, plus ChatML's `<|im_start|>` / `<|im_end|>` as control tokens (as a chat model has them). Its
word pieces are a few hundred common English words and every word of the chat plane's prompts and the
benchmark's sessions, each as written and lowercased, with and without the leading-space marker: a real
model's 32k-128k pieces hold such words whole, so the bench's prompts come to about 1.3 tokens a word, as
with a real tokenizer (byte fallback alone made them 4.5 tokens a word, and the engine's work mostly
prefill).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_WORDS = (
    "the of and to a in is you that it he was for on are as with his they I at be this have from or one had by "
    "word but not what all were we when your can said there use an each which she do how their if will up other "
    "about out many then them these so some her would make like him into time has look two more write go see "
    "number no way could people my than first water been call who oil its now find long down day did get come "
    "made may part over new sound take only little work know place year live me back give most very after thing "
    "our just name good sentence man think say great where help through much before line right too mean old any "
    "same tell boy follow came want show also around form three small set put end does another well large must "
    "big even such because turn here why ask went men read need land different home us move try kind hand "
    "picture again change off play spell air away animal house point page letter mother answer found study "
    "still learn should memory remember user chat reply intent message session code file test job repo path"
)
_PIECES = tuple(_WORDS.split())
VERSION = 2
"""Bumped whenever the model's vocabulary or shape changes: the cached file's name carries it."""
_CHATML = ("<|im_start|>", "<|im_end|>")


def _bench_words() -> list[str]:
    """Every word of the chat plane's prompts and of the benchmark's sessions (64 of them), in first-seen order."""
    import re

    from orchestrator.chat import prompts
    from orchestrator.lab.bench import turns

    texts = ["system user assistant", prompts.SYSTEM, prompts.CLASSIFY, prompts.REPLY, prompts.EXTRACT]
    for i in range(64):
        texts += [t for _, t in turns.history(i)] + [turns.prompt(i), *turns.memories(i)]
    words = re.findall(r"[A-Za-z]+", " ".join(texts))
    return list(dict.fromkeys(w for word in words for w in (word, word.lower())))


@dataclass(frozen=True)
class Shape:
    """The model's size. The default decodes at a few dozen tokens per second per slot on 2 cores; `SHAPES["8b"]`
    is an 8B-class model's (Llama 3 8B: 128-dim heads, 8 key/value heads shared by 32), for a GPU."""

    n_embd: int = 512
    n_layer: int = 8
    n_head: int = 8
    n_ff: int = 1408
    n_ctx: int = 4096
    n_head_kv: int = 0
    """Key/value heads (grouped-query attention); 0: one per head."""

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def kv_heads(self) -> int:
        return self.n_head_kv or self.n_head

    @property
    def slug(self) -> str:
        """A name for the model file: "" for the default shape (its file keeps its name)."""
        if self == Shape():
            return ""
        return f"e{self.n_embd}-l{self.n_layer}-h{self.n_head}-kv{self.kv_heads}-ff{self.n_ff}-c{self.n_ctx}"

    @classmethod
    def parse(cls, spec: str) -> Shape:
        """A preset (`small`, `8b`) or `key=value` pairs, comma-separated, from `small`: `embd`, `layers`, `head_dim`
        (heads = embd / head_dim), `kv_heads`, `ff`, `ctx`. ValueError saying what is wrong."""
        spec = spec.strip()
        if spec in SHAPES:
            return SHAPES[spec]
        known = {"embd": "n_embd", "layers": "n_layer", "head_dim": "", "kv_heads": "n_head_kv", "ff": "n_ff",
                 "ctx": "n_ctx"}  # fmt: skip
        values: dict[str, int] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, eq, value = part.partition("=")
            if not eq or key.strip() not in known or not value.strip().isdigit() or int(value) < 1:
                raise ValueError(
                    f"shape {spec!r}: use {' or '.join(SHAPES)}, or key=value pairs of {', '.join(known)} "
                    "(positive integers), e.g. embd=4096,layers=32,head_dim=128,kv_heads=8,ff=14336"
                )
            values[key.strip()] = int(value)
        base = Shape()
        embd = values.get("embd", base.n_embd)
        head_dim = values.get("head_dim", embd // base.n_head)
        if embd % head_dim:
            raise ValueError(f"shape {spec!r}: embd {embd} is not a multiple of head_dim {head_dim}")
        heads = embd // head_dim
        kv = values.get("kv_heads", heads)
        if heads % kv:
            raise ValueError(f"shape {spec!r}: {heads} heads cannot share {kv} key/value heads evenly")
        return Shape(
            n_embd=embd, n_layer=values.get("layers", base.n_layer), n_head=heads,
            n_ff=values.get("ff", int(embd * 2.75) // 64 * 64), n_ctx=values.get("ctx", base.n_ctx),
            n_head_kv=0 if kv == heads else kv,
        )  # fmt: skip


SHAPES: dict[str, Shape] = {
    "small": Shape(),
    "8b": Shape(n_embd=4096, n_layer=32, n_head=32, n_ff=14336, n_ctx=8192, n_head_kv=8),
}
"""Named shapes for `--shape`: the default, and an 8B-class model's (about 16 GB of f16 weights)."""


def vocabulary() -> tuple[list[bytes], list[float], list[int]]:
    """Tokens, scores and token types: specials, 256 byte tokens, then word pieces (with the ▁ space marker)."""
    tokens: list[bytes] = [b"<unk>", b"<s>", b"</s>", *(t.encode() for t in _CHATML)]
    types = [2, 3, 3, 3, 3]  # unknown, control ×4
    scores = [0.0] * len(tokens)
    for b in range(256):
        tokens.append(f"<0x{b:02X}>".encode())
        types.append(6)  # byte
        scores.append(0.0)
    seen: set[str] = set()
    for n, word in enumerate(dict.fromkeys([*_PIECES, *_bench_words()])):
        for piece in (f"\u2581{word}", word):
            # The tokenizer merges adjacent pieces pairwise, so a word is reachable only through pieces for each
            # of its prefixes ("▁w", "▁wo", "▁wor", "▁word"); those rank below the whole words.
            for end in range(2, len(piece) + 1):
                sub = piece[:end]
                if sub in seen:
                    continue
                seen.add(sub)
                tokens.append(sub.encode())
                types.append(1)  # normal
                scores.append(-float(n) if end == len(piece) else -500.0 - len(piece) + end)
    for ch in " .,:;!?'\"()[]{}-_/\n0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ":
        piece = "\u2581" if ch == " " else ch
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece.encode())
            types.append(1)
            scores.append(-1000.0)
    return tokens, scores, types


def write_model(path: Path, shape: Shape = Shape(), seed: int = 0) -> Path:
    """Write a random-weight llama model to `path` (f16 weights, f32 norms) and return it."""
    try:
        import gguf
        import numpy as np
    except ImportError as missing:  # pragma: no cover - depends on the optional extra
        raise SystemExit(f"{missing.name} is missing: pip install 'orchestrator[bench]'") from None

    rng = np.random.default_rng(seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    e, ff = shape.n_embd, shape.n_ff

    def weight(*dims: int) -> Any:
        return (rng.standard_normal(dims, dtype=np.float32) * (1.0 / np.sqrt(dims[-1]))).astype(np.float16)

    def norm() -> Any:
        return np.ones(e, dtype=np.float32)

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("orchestrator-random-llama")
    writer.add_context_length(shape.n_ctx)
    writer.add_embedding_length(e)
    writer.add_block_count(shape.n_layer)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(n_vocab)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    writer.add_tensor("token_embd.weight", weight(n_vocab, e))
    for i in range(shape.n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        kv = shape.kv_heads * shape.head_dim  # grouped-query attention: fewer key/value heads than query heads
        for name, rows in (("attn_q", e), ("attn_k", kv), ("attn_v", kv), ("attn_output", e)):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(rows, e))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(ff, e))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(ff, e))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(e, ff))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", weight(n_vocab, e))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--shape", default="small", help=f"{' or '.join(SHAPES)}, or key=value pairs (Shape.parse)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        shape = Shape.parse(args.shape)
    except ValueError as e:
        parser.error(str(e))
    out = write_model(args.path, shape, args.seed)
    print(f"{out} ({out.stat().st_size / 1e6:.1f} MB, {len(vocabulary()[0])} tokens)", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
