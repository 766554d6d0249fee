"""A tiny causal language model built here: tests, the LLM quick start and benchmarks use it.

Nothing comes from a model hub. A byte-level BPE tokenizer is trained with ``tokenizers`` on a few
sentences, a Llama with random weights is saved in Hugging Face's folder layout (``config.json``,
``model.safetensors``, tokenizer files, a chat template), exactly what a user uploads. Head size 32:
vLLM's CPU attention takes 32, 64, 80, 96, 112, 128... only. Greedy answers of a random model are
arbitrary but deterministic, which is all a comparison with ``transformers`` needs.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "a model in production answers every request the same way",
    "serving large language models needs streaming and token limits",
    "canary releases move traffic to a new version step by step",
    "hello world, how are you today? I am fine, thank you.",
    "numbers like 1 2 3 4 5 6 7 8 9 10 and words like alpha beta gamma",
]

# A plain chat template: role headers, then the assistant's turn when asked for.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
SPECIAL = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>"]


@dataclass(frozen=True)
class LLMBundle:
    path: Path           # the Hugging Face model folder
    max_model_len: int


def train_tokenizer(out_dir: Path, vocab_size: int = 512):
    """A fast tokenizer trained on :data:`CORPUS`, saved with its chat template; returned loaded."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="</s>", clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def build_tiny_llama(out_dir: Path, *, seed: int = 0, max_model_len: int = 512, layers: int = 2,
                     hidden_size: int = 64) -> LLMBundle:
    """Write (once; reused when present with the same parameters) a random-weight Llama folder; heads of
    32 (``hidden_size`` a multiple of 32; wider models make prefill the larger part of a request)."""
    out_dir = Path(out_dir)
    params = {"seed": seed, "max_model_len": max_model_len, "layers": layers, "format": 1}
    if hidden_size != 64:
        params["hidden_size"] = hidden_size
    stamp = out_dir / ".built"
    if stamp.exists() and json.loads(stamp.read_text()) == params:
        return LLMBundle(out_dir, max_model_len)
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(out_dir)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=layers, num_attention_heads=hidden_size // 32, num_key_value_heads=hidden_size // 32,
        head_dim=32, max_position_embeddings=max_model_len,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False, dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # a wider spread than the default init makes greedy choices far from ties
        for p in model.parameters():
            p.normal_(0.0, 0.2)
    model.save_pretrained(out_dir, safe_serialization=True)
    stamp.write_text(json.dumps(params))
    return LLMBundle(out_dir, max_model_len)


def greedy_reference(model_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The new token ids transformers' greedy ``generate`` gives: what every LLM path is compared with."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model.eval()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=model.config.pad_token_id)
    return out[0, len(prompt_ids):].tolist()


def build_lora_adapter(out_dir: Path, base_dir: Path, *, rank: int = 8, alpha: int = 16, seed: int = 1,
                       modules: tuple[str, ...] = ("q_proj", "v_proj"), scale: float = 0.3) -> Path:
    """A PEFT LoRA adapter folder for the model in ``base_dir``, as ``PeftModel.save_pretrained`` writes one
    (``adapter_config.json`` and ``adapter_model.safetensors``), with random ``lora_A`` and ``lora_B`` (PEFT
    starts B at zero; here both are drawn, so the adapter changes what the model answers)."""
    import torch
    from safetensors.torch import load_file, save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = load_file(str(Path(base_dir) / "model.safetensors"))
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, weight in sorted(base.items()):
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and module.rsplit(".", 1)[-1] in modules:
            out_features, in_features = weight.shape
            prefix = f"base_model.model.{module}"
            tensors[f"{prefix}.lora_A.weight"] = torch.randn(rank, in_features, generator=generator) * scale
            tensors[f"{prefix}.lora_B.weight"] = torch.randn(out_features, rank, generator=generator) * scale
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank, "lora_alpha": alpha,
        "target_modules": list(modules), "lora_dropout": 0.0, "bias": "none", "fan_in_fan_out": False,
        "modules_to_save": None, "use_rslora": False, "base_model_name_or_path": str(base_dir)}, indent=2))
    return out_dir


def merged_greedy_reference(base_dir: Path, adapter_dir: Path, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy ``generate`` with the adapter merged into the weights: W + alpha/r * B @ A."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    config = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    scaling = config["lora_alpha"] / config["r"]
    lora = load_file(str(Path(adapter_dir) / "adapter_model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    model.eval()
    weights = dict(model.named_parameters())
    with torch.no_grad():
        for name, a in lora.items():
            if ".lora_A." in name:
                module = name.split(".lora_A.")[0].removeprefix("base_model.model.")
                b = lora[name.replace(".lora_A.", ".lora_B.")]
                weights[f"{module}.weight"] += scaling * (b @ a)
        out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=model.config.pad_token_id)
    return out[0, len(prompt_ids):].tolist()


def chat_prompt_ids(tokenizer, messages: list[dict]) -> list[int]:
    """The ids the engine gets for a chat: the tokenizer's chat template with the generation prompt."""
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def same_text(text: str, decoded: str) -> bool:
    """Whether an answer's text is the decoded ids: equal, but for a last character whose bytes are
    incomplete (random weights pick byte tokens): vLLM's detokenizer holds those back, a decode of all
    ids shows U+FFFD."""
    return text == decoded or bool(decoded.endswith("\ufffd") and decoded.startswith(text) and text)
