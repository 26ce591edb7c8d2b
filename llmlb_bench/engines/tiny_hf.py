"""A tiny random-weight LLaMA in Hugging Face format, with a locally trained tokenizer: a model
folder vLLM (or any HF-format engine) can serve without downloading anything.

Why written by hand (NumPy and a few lines of safetensors) rather than with
``transformers``: the folder is then written from the project's own
virtualenv, which has no PyTorch; only the ``tokenizers`` package (extra
``tokenizer``) is needed, to train the tokenizer.

The folder holds ``config.json`` (``LlamaForCausalLM``), ``model.safetensors``
(bfloat16, random normal weights, a few MB), ``tokenizer.json`` (byte-level
BPE trained on the replayer's prompt words, see
:mod:`llmlb_bench.replay.prompts`, plus filler words), ``tokenizer_config.json``
(``PreTrainedTokenizerFast`` with a small chat template) and
``generation_config.json``. Choices that matter for measurement:

* byte-level pre-tokenisation splits text before each space-led word, so a
  prompt's tokens are the concatenation of its blocks' tokens and a shared
  text prefix is a shared token prefix (what the engine's prefix cache hashes);
* no BOS or other special token is added to prompts, so
  ``usage.prompt_tokens`` is the prompt's own token count;
* weights are random, so outputs are gibberish and EOS comes early: send
  ``ignore_eos`` (the replayer does by default) to get the trace's lengths;
* ``<think>`` and ``</think>`` are added special tokens (the last two ids), so vLLM's
  ``--reasoning-parser deepseek_r1`` accepts the model; the random weights never choose them,
  :mod:`llmlb_bench.engines.think_tags` forces them where a request asks. Added after training,
  they leave every other token and every prompt's tokenisation as they were.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from llmlb_bench.errors import UserError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

#: special tokens, in id order
SPECIALS = ("<unk>", "<s>", "</s>", "<pad>")
#: reasoning tags (vLLM's deepseek_r1 reasoning parser looks them up in the vocabulary)
THINK_TAGS = ("<think>", "</think>")
#: a chat template in the shape vLLM's chat endpoint needs (roles, contents, generation prompt)
CHAT_TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}\n{{ m['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<s>assistant\n{% endif %}")


def write_tiny_model(dest: str | Path, *, vocab_size: int = 1024, hidden_size: int = 256,
                     intermediate_size: int = 512, num_layers: int = 4, num_heads: int = 4,
                     num_kv_heads: int = 2, max_position_embeddings: int = 4096, seed: int = 0,
                     reachable_eos: bool = True, words_only: bool = False) -> Path:
    """Write the model folder ``dest`` (created; files in it are replaced) and return it.

    The defaults (about 5 MB) decode ~100 tokens/s per stream in vLLM on one
    CPU core: slow enough that the engine, not HTTP, is what a test measures.

    ``reachable_eos=False`` zeroes EOS's row of the output layer, so its logit is
    exactly 0 where the largest of the other random logits is positive (all but
    surely): greedy decoding never ends a sequence, and an engine that cannot be
    told to ignore EOS (``transformers serve`` refuses ``ignore_eos`` and
    ``min_tokens``) still answers with the ``max_tokens`` asked for.

    ``words_only=True`` zeroes every row but the whole prompt words' (:func:`word_token_ids`; EOS
    included), so greedy decoding emits whole words only, each of which streams as visible text. Why:
    a random token that decodes to no text (a byte fragment) streams nothing, so the client reads the
    first token a step or more late and the last one early; on ``transformers serve``, which has no
    ``allowed_token_ids``, the deep-shape replays' client TTFT p50 was 2-39% above the engine's own
    (docs/fidelity-runs.md). vLLM runs pass the same ids as ``allowed_token_ids`` instead."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = _train_tokenizer(vocab_size)
    tokenizer.save(str(dest / "tokenizer.json"))
    vocab = tokenizer.get_vocab_size()
    head_dim = hidden_size // num_heads
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": hidden_size, "intermediate_size": intermediate_size, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "num_key_value_heads": num_kv_heads, "head_dim": head_dim,
        "max_position_embeddings": max_position_embeddings, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "bos_token_id": SPECIALS.index("<s>"), "eos_token_id": SPECIALS.index("</s>"),
        "pad_token_id": SPECIALS.index("<pad>"), "attention_bias": False, "mlp_bias": False,
    }
    rng = np.random.default_rng(seed)

    def rand(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    h, q, kv = hidden_size, num_heads * head_dim, num_kv_heads * head_dim
    embed, head = rand(vocab, h), rand(vocab, h)     # in this order: the seed's weights stay as they were
    if not reachable_eos:
        head[SPECIALS.index("</s>")] = 0.0   # the config's eos_token_id
    if words_only:
        head[np.setdiff1d(np.arange(vocab), _word_ids(tokenizer))] = 0.0
    tensors = {"model.embed_tokens.weight": embed, "model.norm.weight": np.ones(h, np.float32),
               "lm_head.weight": head}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "input_layernorm.weight": np.ones(h, np.float32),
            p + "post_attention_layernorm.weight": np.ones(h, np.float32),
            p + "self_attn.q_proj.weight": rand(q, h), p + "self_attn.k_proj.weight": rand(kv, h),
            p + "self_attn.v_proj.weight": rand(kv, h), p + "self_attn.o_proj.weight": rand(h, q),
            p + "mlp.gate_proj.weight": rand(intermediate_size, h), p + "mlp.up_proj.weight": rand(intermediate_size, h),
            p + "mlp.down_proj.weight": rand(h, intermediate_size),
        })
    _write_safetensors(dest / "model.safetensors", tensors)
    (dest / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (dest / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}) + "\n")
    (dest / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "bos_token": "<s>",
        "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": False, "add_eos_token": False,
        "model_max_length": max_position_embeddings, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE}, indent=1) + "\n")
    return dest


def write_tiny_adapter(dest: str | Path, model_dir: str | Path, *, rank: int = 8,
                       targets: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0) -> Path:
    """Write a random LoRA adapter for the model in ``model_dir`` as a PEFT folder (what vLLM's
    ``--lora-modules NAME=DIR`` loads): ``adapter_config.json`` and ``adapter_model.safetensors``
    with, per layer and target projection, ``lora_A`` (rank x d_in) and ``lora_B`` (d_out x rank).

    Why B is not zero (PEFT initialises it so): an adapter that changes nothing would make a test
    of adapters unable to tell them from the base model. Shapes come from the model's config."""
    cfg = json.loads((Path(model_dir) / "config.json").read_text())
    h = cfg["hidden_size"]
    head = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    out_dim = {"q_proj": cfg["num_attention_heads"] * head, "k_proj": cfg["num_key_value_heads"] * head,
               "v_proj": cfg["num_key_value_heads"] * head, "o_proj": h}
    in_dim = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": cfg["num_attention_heads"] * head}
    unknown = sorted(set(targets) - set(out_dim))
    if unknown:
        raise UserError(f"unknown target module {unknown[0]!r} (choose from {', '.join(out_dim)})", "targets")
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    tensors = {}
    for i in range(cfg["num_hidden_layers"]):
        for t in targets:
            p = f"base_model.model.model.layers.{i}.self_attn.{t}."
            tensors[p + "lora_A.weight"] = (rng.standard_normal((rank, in_dim[t])) * 0.02).astype(np.float32)
            tensors[p + "lora_B.weight"] = (rng.standard_normal((out_dim[t], rank)) * 0.02).astype(np.float32)
    _write_safetensors(dest / "adapter_model.safetensors", tensors)
    (dest / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": 2 * rank, "lora_dropout": 0.0,
        "bias": "none", "target_modules": list(targets), "base_model_name_or_path": str(model_dir),
        "fan_in_fan_out": False, "modules_to_save": None}, indent=1) + "\n")
    return dest


def word_token_ids(model: str | Path) -> list[int]:
    """Ids of the tiny tokenizer's tokens that are one whole prompt word (" the", " of", ...).

    Random weights emit random tokens, byte fragments included, whose decoded text re-tokenises
    differently (from the first token on), so a conversation that sends the answer back could
    never reuse the answer's KV, which a real model's text does. Passing these ids as vLLM's
    ``allowed_token_ids`` keeps answers to whole words that re-tokenise to the same ids."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise UserError("reading the tiny model's tokenizer needs the 'tokenizers' package: "
                        "pip install 'llmlb-bench[tokenizer]'", "tokenizer") from None
    return _word_ids(Tokenizer.from_file(str(Path(model) / "tokenizer.json")))


def _word_ids(tok: Tokenizer) -> list[int]:
    """:func:`word_token_ids` of a tokenizer in memory."""
    from llmlb_bench.replay.prompts import WORDS

    encoded = (tok.encode(" " + w, add_special_tokens=False).ids for w in WORDS)
    return sorted({ids[0] for ids in encoded if len(ids) == 1})


def _corpus() -> list[str]:
    """Training text: the prompt builder's words (so they become one or few tokens each) and
    filler words (a corpus of the prompt words alone runs out of merges below the target size)."""
    from llmlb_bench.replay.prompts import WORDS

    rng = np.random.default_rng(1)
    words = list(WORDS)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    filler = ["".join(rng.choice(letters, int(rng.integers(3, 9)))) for _ in range(2000)]
    lines = [" ".join(rng.permutation(words)) for _ in range(20)]
    lines += [" ".join(filler[i:i + 20]) for i in range(0, len(filler), 20)]
    lines += ["Hello, world! 0123456789 .,;:?!'\"()[]{}<>-_+=*/\\|@#$%^&~`"]
    return lines


def _train_tokenizer(vocab_size: int) -> Tokenizer:   # tokenizers is an optional extra
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise UserError("writing the tiny model's tokenizer needs the 'tokenizers' package: "
                        "pip install 'llmlb-bench[tokenizer]'", "tokenizer") from None
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIALS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_special_tokens(list(THINK_TAGS))
    return tok


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """The safetensors layout (an 8-byte little-endian header length, a JSON header, raw data),
    every tensor stored as bfloat16: float32 rounded to its upper 16 bits."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    blobs, offset = [], 0
    for name, a in tensors.items():
        bits = np.ascontiguousarray(a, np.float32).view(np.uint32)
        bf16 = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")  # round to nearest even
        raw = bf16.tobytes()
        header[name] = {"dtype": "BF16", "shape": list(a.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    tmp = path.with_suffix(".tmp")
    with tmp.open("wb") as f:
        f.write(struct.pack("<Q", len(head)))
        f.write(head)
        for raw in blobs:
            f.write(raw)
    tmp.replace(path)
