#!/usr/bin/env python3
"""Reference chat prompts from Hugging Face for chat_template_test.

Usage: hf_chat_reference.py --shared DIR --requests FILE --out FILE
                            [--engine auto|transformers|jinja2]

Reads FILE, a JSON array of requests
    {"format": "qwen2.5" | "qwen3", "messages": [{"role": ..., "content": ...}, ...],
     "add_generation_prompt": bool, "enable_thinking": bool}
and writes --out: {"engine": "...", "results": [{"text": ...} or {"error": ...}, ...]}, one
result per request, in order.

The templates are the real ones, from DIR/qwen2_5 and DIR/qwen3 (tokenizer_config.json, key
"chat_template"). With the "transformers" engine (the default when it imports) each prompt is
`tokenizer.apply_chat_template(messages, tokenize=False, ...)` on a tokenizer loaded offline from a
temp dir holding the decompressed tokenizer.json and tokenizer_config.json: exactly what a user of
transformers gets. The "jinja2" engine renders the template directly the way transformers compiles
it (sandboxed, trim_blocks, lstrip_blocks, loopcontrols, raise_exception and a tojson filter), for
machines without transformers.

Exit status 3 means neither engine is importable (the C++ test then skips).
"""

import argparse
import json
import lzma
import os
import shutil
import sys
import tempfile

DIRS = {"qwen2.5": "qwen2_5", "qwen3": "qwen3"}


class TransformersEngine:
    def __init__(self, shared):
        import transformers  # noqa: F401  (ImportError is handled by the caller)
        from transformers import AutoTokenizer

        self.name = f"transformers {transformers.__version__} apply_chat_template"
        self.tmp = tempfile.mkdtemp(prefix="gyre_chat_ref_")
        self.tokenizers = {}
        for fmt, sub in DIRS.items():
            src = os.path.join(shared, sub)
            dst = os.path.join(self.tmp, sub)
            os.makedirs(dst)
            with lzma.open(os.path.join(src, "tokenizer.json.xz"), "rb") as f_in:
                with open(os.path.join(dst, "tokenizer.json"), "wb") as f_out:
                    shutil.copyfileobj(f_in, f_out)
            shutil.copy(os.path.join(src, "tokenizer_config.json"), dst)
            self.tokenizers[fmt] = AutoTokenizer.from_pretrained(dst, local_files_only=True)

    def render(self, req):
        return self.tokenizers[req["format"]].apply_chat_template(
            req["messages"], tokenize=False, add_generation_prompt=req["add_generation_prompt"],
            enable_thinking=req["enable_thinking"])

    def close(self):
        shutil.rmtree(self.tmp, ignore_errors=True)


class Jinja2Engine:
    def __init__(self, shared):
        import jinja2
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise jinja2.exceptions.TemplateError(message)

        def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
            return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                              sort_keys=sort_keys)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[loopcontrols])
        env.filters["tojson"] = tojson
        env.globals["raise_exception"] = raise_exception
        self.name = f"jinja2 {jinja2.__version__} (transformers' environment settings)"
        self.templates = {}
        self.special = {}
        for fmt, sub in DIRS.items():
            with open(os.path.join(shared, sub, "tokenizer_config.json"), encoding="utf-8") as f:
                config = json.load(f)
            self.templates[fmt] = env.from_string(config["chat_template"])
            self.special[fmt] = {k: config.get(k) for k in ("bos_token", "eos_token", "pad_token")}

    def render(self, req):
        fmt = req["format"]
        return self.templates[fmt].render(
            messages=req["messages"], tools=None, documents=None,
            add_generation_prompt=req["add_generation_prompt"],
            enable_thinking=req["enable_thinking"], **self.special[fmt])

    def close(self):
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shared", required=True)
    parser.add_argument("--requests", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--engine", choices=["auto", "transformers", "jinja2"], default="auto")
    args = parser.parse_args()

    engines = ["transformers", "jinja2"] if args.engine == "auto" else [args.engine]
    engine = None
    problems = []
    for name in engines:
        try:
            engine = TransformersEngine(args.shared) if name == "transformers" else Jinja2Engine(
                args.shared)
            break
        except ImportError as e:
            problems.append(f"{name}: {e}")
    if engine is None:
        print("hf_chat_reference.py: cannot import a template engine (" + "; ".join(problems) +
              "); pip install transformers jinja2", file=sys.stderr)
        sys.exit(3)

    with open(args.requests, encoding="utf-8") as f:
        requests = json.load(f)
    results = []
    try:
        for req in requests:
            try:
                results.append({"text": engine.render(req)})
            except Exception as e:  # the C++ test decides whether an error was expected
                results.append({"error": f"{type(e).__name__}: {e}"})
    finally:
        engine.close()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump({"engine": engine.name, "results": results}, f, ensure_ascii=False)


if __name__ == "__main__":
    main()
