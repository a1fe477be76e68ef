"""Reference side of the Hugging Face parity test (tests/integration/hf_parity_test.cc).

Builds random-init tiny models of each supported architecture with transformers (from a config;
nothing is downloaded), saves each as an HF directory, and writes the log-softmax of a token
sequence next to it (ref.json): computed in float32 ("full") and in bfloat16 ("full_bf16"). Exit status 77 means the reference packages are missing.

usage: hf_parity.py OUT_DIR           build reference models into OUT_DIR
       hf_parity.py --check DIR TEXT  load a Gyre-written DIR with transformers and tokenizers,
                                      print {"ids": tokenizer ids of TEXT, "full": log-softmax}
       hf_parity.py --check-auto DIR TEXT
                                      the same through AutoTokenizer (as TRL loads a model), and
                                      the special-token ids it and config.json report
"""
import json
import os
import sys

try:
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
except ImportError as e:  # the C++ test skips with this message
    print(f"reference packages missing: {e}")
    sys.exit(77)


def configs():
    common = dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, intermediate_size=128, max_position_embeddings=256,
                  rms_norm_eps=1e-6)
    yield "llama", LlamaConfig(**common, tie_word_embeddings=False, rope_parameters={
        "rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    yield "qwen2", Qwen2Config(**common, tie_word_embeddings=True,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6})
    # Qwen3 with an explicit head_dim that differs from hidden_size / heads.
    q3 = dict(common)
    yield "qwen3", Qwen3Config(**q3, head_dim=24, tie_word_embeddings=False,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e6})


def check(model_dir, text):
    from tokenizers import Tokenizer
    ids = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json")).encode(text).ids
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    print(json.dumps({"ids": ids, "full": torch.log_softmax(logits, -1).tolist()}))


def check_auto(model_dir, text):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"]
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    print(json.dumps({"ids": ids, "full": torch.log_softmax(logits, -1).tolist(),
                      "decoded": tok.decode(ids),
                      "tokenizer": {"bos": tok.bos_token_id, "eos": tok.eos_token_id,
                                    "pad": tok.pad_token_id},
                      "config": {"bos": model.config.bos_token_id,
                                 "eos": model.config.eos_token_id,
                                 "pad": model.config.pad_token_id}}))


def main():
    if sys.argv[1] == "--check":
        check(sys.argv[2], sys.argv[3])
        return
    if sys.argv[1] == "--check-auto":
        check_auto(sys.argv[2], sys.argv[3])
        return
    out = sys.argv[1]
    torch.manual_seed(1234)
    ids = [int(x) for x in torch.randint(0, 96, (40,))]
    for name, cfg in configs():
        model = AutoModelForCausalLM.from_config(cfg).float().eval()
        with torch.no_grad():  # large random weights so every part of the model matters
            for pname, p in model.named_parameters():
                if pname.endswith("norm.weight"):
                    p.copy_(1.0 + 0.3 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.15)
        d = os.path.join(out, name)
        model.save_pretrained(d, safe_serialization=True)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        ref = {"ids": ids, "full": torch.log_softmax(logits, -1).tolist()}
        # The same weights loaded in bfloat16 (model.dtype: bfloat16), logits read in float32.
        # Loaded, not model.to(bfloat16): that would also round the RoPE inverse frequencies
        # (a buffer) to bfloat16, which from_pretrained(dtype=bfloat16) keeps in float32.
        half = AutoModelForCausalLM.from_pretrained(d, dtype=torch.bfloat16).eval()
        with torch.no_grad():
            logits = half(torch.tensor([ids])).logits[0].float()
        ref["full_bf16"] = torch.log_softmax(logits, -1).tolist()
        with open(os.path.join(d, "ref.json"), "w") as f:
            json.dump(ref, f)
    print("ok")


if __name__ == "__main__":
    main()
