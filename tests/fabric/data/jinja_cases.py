"""Writes a parity corpus for the chat template renderer in fabric/data/jinja.{h,cc}.

    python3 jinja_cases.py OUT_DIR

Writes OUT_DIR/jinja_cases.json, a list of cases
    {"name": str, "template": str, "context": object, "expected": str}
and, for templates that must fail,
    {"name": str, "template": str, "context": object, "error": str}
where "error" is str() of the exception Jinja raised (at compile or render time).

Every case is rendered by transformers' own environment, the one apply_chat_template uses:
_compile_jinja_template(template).render(**context), i.e. ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks, loopcontrols, the {% generation %} extension, transformers' tojson
(json.dumps with ensure_ascii=False) and the globals raise_exception, namespace and dict.

Four groups: A, single constructs, each isolating one feature (printing of values, whitespace
control, loops, scoping, operators, filters, tests, str and dict methods); B, error cases; C,
original chat templates written in the style of the Llama 3.1, Qwen2.5, Mistral, Gemma, Phi-3,
DeepSeek and Zephyr ones, each rendered over several conversations with and without
add_generation_prompt; and D, harder ones: macros (defaults, keyword arguments, recursion,
scoping), then original templates that reproduce the constructs of today's Qwen3 (a reversed
loop over a namespace, think blocks), Hermes (a recursive macro over JSON schemas), Gemma 3
(content as a list of parts), Llama 3.1 (tools in the user message, ipython results), Mistral v3
(tool-call ids) and DeepSeek-V3 (tool calls, namespace flags) ones, a template built on
{% set %}...{% endset %} and the rarer filters (indent, wordcount, format, unique), whitespace in
indented and CRLF templates, and more error cases. No case calls strftime_now, so the output does
not depend on the date. E holds what reviews of the renderer found: dictsort's pairs, dotted
attribute paths, map over any filter, split's and rsplit's remainders, the filters' positional
arguments, printf-style formatting, the scopes of generation and set blocks.
"""
import json
import os
import sys

from transformers.utils.chat_template_utils import _compile_jinja_template

CASES = []   # (name, template, context): must render
ERRORS = []  # (name, template, context): must raise


def case(name, template, **context):
    CASES.append((name, template, context))


def error(name, template, **context):
    ERRORS.append((name, template, context))


# ---------------------------------------------------------------- A. single constructs

case("text_plain", "Hello, world!")
case("text_unicode", "héllo 中文 🙂 {{ s }}", s="naïve 日本 👍")
case("print_string", "[{{ s }}]", s="a b")
case("print_context_not_reevaluated", "{{ s }}", s="{{ x }} {% if %}")
case("print_int_float", "{{ i }} {{ f }} {{ g }} {{ h }} {{ 1.0 }} {{ 2.5e3 }} {{ 6 / 2 }}",
     i=42, f=1.0, g=0.5, h=-3.25)
case("print_float_repr", "{{ 0.1 + 0.2 }} {{ 1 / 3 }} {{ 1e20 }} {{ 1e-7 }} {{ 1e16 }} {{ 123456.789 }}")
case("print_bool_none", "{{ t }} {{ f }} {{ n }} {{ true }} {{ false }} {{ none }} {{ True }}",
     t=True, f=False, n=None)
case("print_undefined", "[{{ nope }}]")
case("print_list", "{{ xs }} {{ [] }}", xs=["a", 1, 2.5, True, None])
case("print_dict", "{{ d }} {{ {} }}", d={"a": 1, "b": "x", "c": [1, {"d": None}]})
case("print_repr_quotes", r"""{{ ["it's", 'say "hi"', 'a\nb', 'tab\tx', 'back\\slash'] }}""")
case("print_literals", "{{ {'k': [1, 2.0, 'v']} }} {{ dict(a=1, b=none) }}")

case("ws_block_minus", "a  {%- if true -%}  b  {%- endif -%}  c")
case("ws_expr_minus", "x \n {{- 'y' -}} \n z")
case("ws_comment_minus", "a \n {#- comment -#} \n b")
case("ws_minus_multiline", "line1\n\n   {%- if true %}\nline2\n{%- endif %}\n\nline3")
case("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter")
case("trim_blocks_comment", "{# c #}\nx\n  {# indented #}\ny")
case("lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\ndone")
case("lstrip_blocks_tabs", "\t \t{% for i in [1, 2] %}\n\t{{ i }}\n\t{% endfor %}\nend")
case("lstrip_not_expr", "  {{ 'x' }}\nafter")
case("lstrip_not_after_text", "a  {% if true %}b{% endif %}")
case("lstrip_plus", "  {%+ if true %}x{% endif %}")
case("trim_plus", "{% if true +%}\nx{% endif %}")
case("trailing_newline_one", "x\n")
case("trailing_newline_two", "x\n\n")
case("trailing_newline_after_block", "{% if true %}x{% endif %}\n")
case("comment", "a{# hidden {{ x }} #}b{#\nmulti\nline\n#}c")

case("if_elif_else", "{% for v in [0, 1, 2] %}{% if v == 0 %}zero{% elif v == 1 %}one"
     "{% else %}many{% endif %},{% endfor %}")
case("if_truthiness", "{% for v in vals %}{{ 'T' if v else 'F' }}{% endfor %}",
     vals=[0, 1, 0.0, "", "a", [], [0], {}, {"a": 1}, None, True, False])
case("for_loop_vars", "{% for x in xs %}{{ x }}:{{ loop.index }}/{{ loop.index0 }}/{{ loop.first }}/"
     "{{ loop.last }}/{{ loop.length }}/{{ loop.revindex }}/{{ loop.revindex0 }};{% endfor %}",
     xs=["a", "b", "c"])
case("for_previtem_nextitem", "{% for x in xs %}[{{ loop.previtem is defined }} {{ loop.previtem }}|"
     "{{ loop.nextitem is defined }} {{ loop.nextitem }}]{% endfor %}", xs=[1, 2, 3])
case("for_else_empty", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", xs=[])
case("for_else_nonempty", "{% for x in xs %}{{ x }}{% else %}empty{% endfor %}", xs=[1])
case("for_if_filter", "{% for x in xs if x % 2 == 0 %}{{ x }}@{{ loop.index }}/{{ loop.length }}"
     "{{ '.' if loop.last }} {% endfor %}", xs=[1, 2, 3, 4, 5, 6])
case("for_dict_keys", "{% for k in d %}{{ k }},{% endfor %}", d={"b": 1, "a": 2})
case("for_items_unpack", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
     d={"role": "user", "n": 3})
case("for_string", "{% for c in 'abc' %}{{ c }}-{% endfor %}")
case("for_break_continue", "{% for x in range(10) %}{% if x == 1 %}{% continue %}{% endif %}"
     "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}")
case("for_nested", "{% for a in [1, 2] %}{% set outer = loop.index %}{% for b in 'xy' %}"
     "{{ outer }}{{ b }}{{ loop.index }} {% endfor %}{% endfor %}")
case("for_loop_cycle", "{% for x in xs %}{{ loop.cycle('odd', 'even') }} {% endfor %}", xs=[1, 2, 3])

case("set_loop_no_leak", "{% set x = 1 %}{% for i in [1, 2] %}{% set x = x + i %}{{ x }}"
     "{% endfor %}|{{ x }}")
case("set_in_if_leaks", "{% if true %}{% set y = 5 %}{% endif %}{{ y }}")
case("set_overrides_context", "{% set messages = messages[1:] %}{{ messages | length }}",
     messages=[1, 2, 3])
case("set_namespace", "{% set ns = namespace(found=false, n=0) %}{% for x in xs %}"
     "{% if x == 'b' %}{% set ns.found = true %}{% endif %}{% set ns.n = ns.n + 1 %}{% endfor %}"
     "{{ ns.found }} {{ ns.n }}", xs=["a", "b", "c"])
case("set_block", "{% set x %}  hi {{ 1 + 1 }}\n{% endset %}[{{ x }}]")
case("set_tuple_unpack", "{% set a, b = [1, 'two'] %}{{ b }}{{ a }}")

case("string_escapes", r"""{{ 'a\nb' }}|{{ "q\"q" }}|{{ 'it\'s' }}|{{ 'back\\slash' }}|{{ '\u00e9\t.' }}""")
case("string_adjacent", "{{ 'a' 'b' \"c\" }}")
case("op_arith_int", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} "
     "{{ 7 % 3 }} {{ -7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ -x }}", x=5)
case("op_arith_float", "{{ 1 + 2.5 }} {{ 1.5 * 2 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }} {{ 2 ** 0.5 }}")
case("op_precedence", "{{ 2 + 3 * 4 }} {{ (2 + 3) * 4 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} "
     "{{ -3 | abs }} {{ 'x' + 1 ~ 2 }} {{ 2 * 3 ~ 4 }}")
case("op_strings", "{{ 'a' + 'b' }} {{ 'a' ~ 1 ~ none ~ true }} {{ 'ab' * 3 }} {{ [1] + [2] }}")
case("op_compare", "{{ 1 == 1.0 }} {{ 1 != 2 }} {{ 2 < 3 }} {{ 3 <= 3 }} {{ 'a' < 'b' }} "
     "{{ 'b' > 'abc' }} {{ [1, 2] == [1, 2] }} {{ 'x' == none }} {{ none == none }}")
case("op_in", "{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in d }} {{ 1 in d }} "
     "{{ 'z' not in 'abc' }} {{ 'k' not in d }}", d={"k": 0})
case("op_and_or_values", "[{{ 0 or 'x' }}] [{{ 'a' and 'b' }}] [{{ '' and 'b' }}] [{{ none or [] }}] "
     "[{{ 1 or nope }}] [{{ not 0 }}] [{{ not 'a' }}] [{{ not nope }}]")
case("op_ternary", "[{{ 'y' if t else 'n' }}] [{{ 'y' if f else 'n' }}] [{{ 'y' if f }}] "
     "[{{ ('y' if f) is defined }}]", t=True, f=False)

case("access_attr_subscript", "{{ m.role }} {{ m['role'] }} {{ m.get('role') }} {{ m['con' ~ 'tent'] }}",
     m={"role": "user", "content": "hi"})
case("access_missing_key", "[{{ m.nope }}] [{{ m['nope'] }}] {{ m.nope is defined }} "
     "{{ 'falsy' if not m.nope else 'truthy' }} {{ m.nope is none }}", m={"role": "user"})
case("access_list_index", "{{ xs[0] }} {{ xs[-1] }} [{{ xs[10] }}] {{ xs[10] is defined }} "
     "{{ xs[i] }}", xs=["a", "b", "c"], i=1)
case("access_nested", "{{ m.tool_calls[0].function.name }} {{ m['tool_calls'][0]['function']['arguments'].city }}",
     m={"tool_calls": [{"function": {"name": "f", "arguments": {"city": "Oslo"}}}]})
case("slice_list", "{{ xs[1:] }} {{ xs[:-1] }} {{ xs[::-1] }} {{ xs[1:3] }} {{ xs[::2] }} {{ xs[5:] }}",
     xs=[1, 2, 3, 4])
case("slice_string", "{{ s[1:] }}|{{ s[:-1] }}|{{ s[::-1] }}|{{ s[1:3] }}|{{ s[-2:] }}", s="héllo")

case("filter_trim", "[{{ '  a b \n' | trim }}] [{{ 'xxaxx' | trim('x') }}] [{{ nope | trim }}]")
case("filter_length_count", "{{ xs | length }} {{ 'héllo' | length }} {{ d | length }} {{ xs | count }} "
     "{{ nope | length }}", xs=[1, 2, 3], d={"a": 1})
case("filter_case", "{{ 'hELLO wORLD' | upper }} {{ 'hELLO' | lower }} {{ 'hELLO wORLD' | capitalize }} "
     "{{ \"hello they're wORLD-foo (bar)\" | title }}")
case("filter_default", "[{{ nope | default('d') }}] [{{ '' | default('d') }}] [{{ '' | default('d', true) }}] "
     "[{{ none | default('d') }}] [{{ none | default('d', true) }}] [{{ nope | d('x') }}] [{{ 0 | d(1) }}]")
case("filter_join", "{{ xs | join }}|{{ xs | join(', ') }}|{{ ms | join('/', attribute='role') }}",
     xs=["a", 1, 2.5], ms=[{"role": "user"}, {"role": "assistant"}])
case("filter_first_last", "{{ xs | first }} {{ xs | last }} {{ 'abc' | first }} {{ 'abc' | last }}",
     xs=[1, 2, 3])
case("filter_conversions", "{{ 1 | string }} {{ '42' | int }} {{ '3.5' | float }} {{ 'x' | int }} "
     "{{ '3.7' | int }} {{ 3.7 | int }} {{ 2 | float }} {{ 'abc' | list }} {{ none | string }} "
     "{{ true | int }} {{ [1, 2] | string }}")
case("filter_select_reject", "{{ xs | select('equalto', 2) | list }} {{ xs | reject('equalto', 2) | list }} "
     "{{ xs | select('odd') | list }} {{ ys | select | list }} {{ ys | reject('none') | list }}",
     xs=[1, 2, 3, 2], ys=[0, 1, None, "", "a"])
MSGS = [{"role": "system", "content": "S"}, {"role": "user", "content": "U1"},
        {"role": "assistant", "content": "A1", "tool_calls": []}, {"role": "user", "content": "U2"}]
case("filter_selectattr", "{{ messages | selectattr('role', 'equalto', 'system') | map(attribute='content') | list }} "
     "{{ messages | rejectattr('role', 'equalto', 'system') | map(attribute='content') | join(',') }} "
     "{{ messages | selectattr('tool_calls', 'defined') | list | length }} "
     "{{ messages | selectattr('role', 'eq', 'user') | list | length }}", messages=MSGS)
case("filter_map", "{{ ms | map(attribute='content') | list }} {{ ['a', 'b'] | map('upper') | join }} "
     "{{ ms | map(attribute='nope', default='-') | join }}",
     ms=[{"content": "x"}, {"content": "y"}])
case("filter_items", "{% for k, v in d | items %}{{ k }}={{ v }} {% endfor %}", d={"z": 1, "a": [2]})
case("tojson_nested", "{{ d | tojson }}", d={"a": [1, 2, {"b": None}], "c": "x"})
case("tojson_scalars", "{{ true | tojson }} {{ false | tojson }} {{ none | tojson }} {{ 1 | tojson }} "
     "{{ 1.0 | tojson }} {{ 0.5 | tojson }} {{ f | tojson }} {{ 'x' | tojson }} {{ [] | tojson }} {{ {} | tojson }}",
     f=2.0)
case("tojson_non_ascii", "{{ s | tojson }} {{ d | tojson }}", s="é 中文 🙂", d={"ключ": "värde"})
case("tojson_escapes", "{{ s | tojson }}", s="say \"hi\"\nnext\ttab \\ <b>&'</b> \x01")
case("tojson_indent2", "{{ d | tojson(indent=2) }}", d={"a": [1, {"b": [], "c": {}}], "d": "é"})
case("tojson_indent4", "{{ d | tojson(indent=4) }}", d={"name": "f", "params": {"x": 1.5, "y": [True, None]}})
case("tojson_options", "{{ d | tojson(separators=(',', ':')) }} {{ d | tojson(sort_keys=true) }}",
     d={"b": 1, "a": [1, 2]})
case("tojson_context_floats", "{{ xs | tojson }} {{ xs }}", xs=[1.0, 0.5, 100.0, 1e-05, 3])
case("filter_replace", "{{ 'aaa' | replace('a', 'b') }} {{ 'aaa' | replace('a', 'b', 2) }} "
     "{{ 'a\\nb' | replace('\\n', ' ') }}")
case("filter_safe_abs_round", "{{ '<b>&' | safe }} {{ x | abs }} {{ 2.5 | round }} {{ 3.5 | round }} "
     "{{ 3.14159 | round(2) }} {{ 2.7 | round(0, 'floor') }} {{ 2.1 | round(0, 'ceil') }} {{ 7 | round }}",
     x=-3)
case("filter_unique", "{{ ['a', 'A', 'b', 'a'] | unique | list }} {{ [3, 1, 3] | unique | list }}")

case("test_types", "{% for v in vals %}{{ v is none }},{{ v is boolean }},{{ v is integer }},{{ v is float }},"
     "{{ v is number }},{{ v is string }},{{ v is mapping }},{{ v is iterable }},{{ v is sequence }}\n"
     "{% endfor %}", vals=[None, True, 1, 1.5, "a", [1], {"a": 1}])
case("test_defined", "{{ x is defined }} {{ nope is defined }} {{ nope is undefined }} {{ n is defined }} "
     "{{ nope is none }} {{ nope is string }} {{ not nope is defined }}", x=1, n=None)
case("test_true_false", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} "
     "{{ none is false }}")
case("test_compare", "{{ 2 is equalto 2 }} {{ 2 is eq 3 }} {{ 2 is ne 3 }} {{ 3 is odd }} {{ 3 is even }} "
     "{{ 9 is divisibleby(3) }} {{ 9 is divisibleby 4 }} {{ 'a' is in 'abc' }} {{ 2 is in [1, 2] }}")
case("test_is_not", "{{ none is not none }} {{ 1 is not string }} {{ x is not defined }} "
     "{{ 'a' is not in ['a'] }}", x=0)

case("str_strip", "[{{ s.strip() }}] [{{ 'xxaxy'.strip('xy') }}] [{{ s.lstrip() }}] [{{ s.rstrip() }}] "
     "[{{ 'aab'.lstrip('a') }}] [{{ 'baa'.rstrip('a') }}]", s=" \n a b \t")
case("str_split", "{{ 'a b  c '.split() }} {{ 'a,b,,c'.split(',') }} {{ 'a,b,c'.split(',', 1) }} "
     "{{ 'x</think>y</think>z'.split('</think>')[-1] }} {{ ''.split(',') }} {{ ''.split() }}")
case("str_startswith", "{{ 'abc'.startswith('a') }} {{ 'abc'.startswith(('x', 'a')) }} "
     "{{ 'abc'.endswith('bc') }} {{ 'abc'.endswith(('x', 'y')) }}")
case("str_methods", "{{ 'aBc'.upper() }} {{ 'aBc'.lower() }} {{ 'a-b-c'.replace('-', '+') }} "
     "{{ \"they're here\".title() }} {{ 'hello'.find('l') }} {{ 'hello'.find('z') }} {{ 'hello'.count('l') }} "
     "{{ 'hello world'.capitalize() }}")
case("dict_methods", "{% for k, v in d.items() %}{{ k }}:{{ v }} {% endfor %}|{% for k in d.keys() %}{{ k }}"
     "{% endfor %}|{% for v in d.values() %}{{ v }}{% endfor %}|{{ d.get('a') }} [{{ d.get('z') }}] "
     "{{ d.get('z', 'def') }} {{ d.get('z') is none }}", d={"a": 1, "b": 2})
case("range", "{{ range(3) | list }} {% for i in range(1, 4) %}{{ i }}{% endfor %} {{ range(0, 10, 3) | list }} "
     "{{ range(3, 0, -1) | list }} {{ range(0) | list }}")
case("generation_block", "A{% generation %}x{{ 1 + 1 }}\n{% endgeneration %}B")
case("unknown_filter_in_untaken_branch", "{% if false %}{{ x | nosuchfilter }}{% endif %}ok")

# ---------------------------------------------------------------- B. errors

error("error_raise_exception", "{% if messages | length > 1 %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}x", messages=[1, 2])
error("error_undefined_attribute", "line1\n{{ foo.bar }}")
error("error_undefined_attribute_is_defined", "{{ foo.bar is defined }}")
error("error_str_plus_int", "{{ 'a' + 1 }}")
error("error_unknown_filter", "a\n{{ x | nosuchfilter }}", x=1)
error("error_unclosed_if", "{% if true %}\nx")
error("error_endfor_without_for", "x\n{% endfor %}")
error("error_call_undefined", "{{ nosuch() }}")
error("error_division_by_zero", "{{ 1 / 0 }}")
error("error_sandbox_list_append", "{% set xs = [] %}{{ xs.append(1) }}")

# ---------------------------------------------------------------- C. chat templates

LLAMA3 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- An optional leading system message becomes part of the system block #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] | trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none %}
    {{- "You have access to the functions below. To call one, answer with JSON of the form " }}
    {{- '{"name": function name, "parameters": {argument name: value}}.\n\n' }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- for message in messages %}
    {%- if message.role == 'tool' or message.role == 'ipython' %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or (message.content is iterable and message.content is not string) %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- elif 'tool_calls' in message %}
        {%- set call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + call.name + '", "parameters": ' + call.arguments | tojson + '}' }}
        {{- "<|eot_id|>" }}
    {%- else %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

QWEN = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content }}
    {%- else %}
        {{- 'You are a careful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nThese functions may be called. Their signatures are inside <tools></tools>:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nWrite each call inside <tool_call></tool_call> as:\n<tool_call>\n{\"name\": <name>, \"arguments\": <object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are a careful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""

MISTRAL = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message['content'] + '[/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token }}
    {%- else %}
        {{- raise_exception('Only user, assistant and one leading system message are supported.') }}
    {%- endif %}
{%- endfor %}
"""

GEMMA = ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
         "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
         "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate "
         "user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}"
         "{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
         "{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}"
         "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}")

PHI3 = ("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n' + "
        "message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' "
        "+ message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_generation_prompt %}"
        "{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")

DEEPSEEK = r"""{% if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{% set ns = namespace(is_first=false, system_prompt='') %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.is_first %}{% set ns.system_prompt = ns.system_prompt + '\n\n' %}{% endif %}
        {%- set ns.system_prompt = ns.system_prompt + message['content'] -%}
        {%- set ns.is_first = true -%}
    {%- endif %}
{%- endfor %}
{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {{- '<｜User｜>' + message['content'] }}
    {%- elif message['role'] == 'assistant' %}
        {% set content = message['content'] %}
        {%- if '</think>' in content %}
            {%- set content = content.split('</think>')[-1] %}
        {%- endif %}
        {{- '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
    {%- endif %}
{%- endfor %}
{% if add_generation_prompt %}{{ '<｜Assistant｜><think>\n' }}{% endif %}"""

GENERATION = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
              "{% if message['role'] == 'assistant' %}{% generation %}{{ message['content'] + '<|im_end|>' }}"
              "{% endgeneration %}{{ '\n' }}{% else %}{{ message['content'] + '<|im_end|>\n' }}{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

ZEPHYR = """{% for message in messages %}
{% if message['role'] == 'user' %}
{{ '<|user|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'system' %}
{{ '<|system|>\\n' + message['content'] + eos_token }}
{% elif message['role'] == 'assistant' %}
{{ '<|assistant|>\\n'  + message['content'] + eos_token }}
{% endif %}
{% if loop.last and add_generation_prompt %}
{{ '<|assistant|>' }}
{% endif %}
{% endfor %}"""

SYSTEM = [{"role": "system", "content": "You are terse. Réponds en français si on te parle français."},
          {"role": "user", "content": "Bonjour, ça va ? 中文也可以吗？"},
          {"role": "assistant", "content": "Oui, ça va 🙂 可以。"}]
MULTI = [{"role": "user", "content": "What is 2+2?"},
         {"role": "assistant", "content": "  4\n"},
         {"role": "user", "content": "\nAnd 3+3?  "},
         {"role": "assistant", "content": "6"}]
USER = [{"role": "user", "content": "  Tell me a joke about \"quotes\" and {{ braces }}.\n\n"}]
BAD_ORDER = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. Zürich"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}}}
TOOL = [{"role": "user", "content": "Weather in Zürich?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}]},
        {"role": "tool", "content": "{\"temperature\": 21.5, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21.5 °C and clear."}]
THINK = [{"role": "system", "content": "Think first."},
         {"role": "system", "content": "Then answer."},
         {"role": "user", "content": "1+1?"},
         {"role": "assistant", "content": "<think>\nsimple sum\n</think>\n\n2"},
         {"role": "user", "content": "2+2?"}]

TOKENS = {"llama": ("<|begin_of_text|>", "<|eot_id|>"), "qwen": ("", "<|endoftext|>"),
          "mistral": ("<s>", "</s>"), "gemma": ("<bos>", "<eos>"), "phi3": ("<s>", "<|endoftext|>"),
          "deepseek": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
          "generation": ("", "<|im_end|>"), "zephyr": ("<s>", "</s>")}
CHATS = [  # (template name, template, conversations, extra context)
    ("llama", LLAMA3, {"system": SYSTEM, "multi": MULTI, "user": USER}, {"tools": None}),
    ("qwen", QWEN, {"system": SYSTEM, "multi": MULTI, "user": USER}, {"tools": None}),
    ("mistral", MISTRAL, {"system": SYSTEM, "multi": MULTI, "user": USER}, {}),
    ("gemma", GEMMA, {"multi": MULTI, "user": USER}, {}),
    ("phi3", PHI3, {"system": SYSTEM, "multi": MULTI, "user": USER}, {}),
    ("deepseek", DEEPSEEK, {"system": SYSTEM, "multi": MULTI, "think": THINK}, {}),
    ("generation", GENERATION, {"system": SYSTEM, "multi": MULTI, "user": USER}, {}),
    ("zephyr", ZEPHYR, {"system": SYSTEM, "multi": MULTI, "user": USER}, {}),
]
for tname, template, convs, extra in CHATS:
    bos, eos = TOKENS[tname]
    for cname, messages in convs.items():
        for gen in (False, True):
            case(f"chat_{tname}_{cname}_{'gen' if gen else 'nogen'}", template, messages=messages,
                 add_generation_prompt=gen, bos_token=bos, eos_token=eos, **extra)
case("chat_llama_tools_gen", LLAMA3, messages=TOOL[:1], tools=[WEATHER], add_generation_prompt=True,
     bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
case("chat_llama_tool_call_nogen", LLAMA3, messages=TOOL, tools=[WEATHER], add_generation_prompt=False,
     date_string="01 Jan 2025", bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
case("chat_llama_custom_tools_gen", LLAMA3, messages=SYSTEM[:2], custom_tools=[WEATHER],
     add_generation_prompt=True, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
case("chat_qwen_tools_gen", QWEN, messages=SYSTEM[:2], tools=[WEATHER], add_generation_prompt=True,
     bos_token="", eos_token="<|endoftext|>")
case("chat_qwen_tool_call_nogen", QWEN, messages=TOOL, tools=[WEATHER], add_generation_prompt=False,
     bos_token="", eos_token="<|endoftext|>")
case("chat_deepseek_no_add_generation_prompt", DEEPSEEK, messages=MULTI,
     bos_token="<｜begin▁of▁sentence｜>", eos_token="<｜end▁of▁sentence｜>")
error("error_chat_mistral_alternation", MISTRAL, messages=BAD_ORDER, add_generation_prompt=False,
      bos_token="<s>", eos_token="</s>")
error("error_chat_gemma_system", GEMMA, messages=SYSTEM, add_generation_prompt=True,
      bos_token="<bos>", eos_token="<eos>")


# ---------------------------------------------------------------- D. macros and harder chat templates

case("macro_defaults_kwargs", "{% macro f(a, b='x', c=none) %}{{ a }}-{{ b }}-{{ c }}{% endmacro %}"
     "{{ f(1) }}|{{ f(1, b=2) }}|{{ f(a=3, c='z') }}|{{ f(1, 2, 3) }}|[{{ f() }}]")
case("macro_recursive", "{% macro down(n) %}{% if n > 0 %}{{ n }},{{ down(n - 1) }}{% else %}go{% endif %}"
     "{% endmacro %}{{ down(3) }}")
case("macro_scope", "{% set x = 1 %}{% macro f(a) %}{% set a = a ~ '!' %}{{ a }}{{ x }}{{ y }}{% endmacro %}"
     "{% set x = 2 %}{% set a = 'o' %}{% for y in [5] %}{{ f('i') }}{% endfor %}{{ a }}", y=0)
case("macro_result_is_string", "{% macro f() %} x {% endmacro %}{% macro e() %}{% endmacro %}"
     "[{{ f() | trim }}][{{ f() + 'y' }}][{{ 'y' if f() }}]{% set z = f() %}[{{ z }}][{{ f() is string }}]"
     "[{{ 'T' if e() else 'F' }}][{{ e() | length }}]")
case("macro_whitespace", "{% macro turn(role, text) %}\n    <{{ role }}>\n    {% if text %}\n        {{ text }}\n"
     "    {% endif %}\n{% endmacro %}\nA\n{{ turn('user', 'hi') }}B{{ turn('bot', '') }}C\n")
case("macro_mutates_namespace", "{% macro bump(ns) %}{% set ns.n = ns.n + 1 %}{% endmacro %}"
     "{% set ns = namespace(n=0) %}{{ bump(ns) }}{{ bump(ns) }}{{ ns.n }}")
case("dict_items_attribute_is_the_method", "{{ s.items is defined }} {{ s.items.type is defined }} "
     "{{ s['items'].type }} [{{ {'a': 1}[s.nope] }}] {{ {'a': 1}[['a']] is defined }}",
     s={"type": "array", "items": {"type": "string"}})
case("unknown_test_in_untaken_branch", "{% if false %}{{ 3 is nosuchtest }}{% endif %}x")
case("loop_outside_loop_prints_empty", "[{{ loop }}] {{ loop is defined }}")

QWEN3 = r"""{%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nThe functions you may call are described inside <tools></tools>:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" + tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nPut each call inside <tool_call></tool_call> as {\"name\": ..., \"arguments\": ...}.<|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string
          and not (message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- set content = message.content if message.content is string else '' %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- elif '</think>' in content %}
            {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- set content = content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' }}
        {%- if loop.index0 > ns.last_query_index and (loop.last or reasoning_content) %}
            {{- '<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' }}
        {%- endif %}
        {{- content.lstrip('\n') }}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if loop.first and content or not loop.first %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or messages[loop.index0 - 1].role != "tool" %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
"""

HERMES = r"""{%- macro json_to_python_type(json_spec) %}
    {%- set basic_type_map = {
        "string": "str",
        "number": "float",
        "integer": "int",
        "boolean": "bool",
        "null": "None"
    } %}
    {%- if basic_type_map[json_spec.type] is defined %}
        {{- basic_type_map[json_spec.type] }}
    {%- elif json_spec.type == "array" %}
        {{- "list[" + json_to_python_type(json_spec['items']) + "]" }}
    {%- elif json_spec.type == "object" %}
        {%- if json_spec.additionalProperties is defined %}
            {{- "dict[str, " + json_to_python_type(json_spec.additionalProperties) + "]" }}
        {%- else %}
            {{- "dict" }}
        {%- endif %}
    {%- elif json_spec.type is iterable and json_spec.type is not string %}
        {{- "Union[" }}
        {%- for t in json_spec.type %}
            {{- json_to_python_type({"type": t}) }}
            {%- if not loop.last %}{{- "," }}{%- endif %}
        {%- endfor %}
        {{- "]" }}
    {%- else %}
        {{- "Any" }}
    {%- endif %}
{%- endmacro %}
{%- macro wrap(body, tag='tool_response', sep='\n') %}
    {{- '<' + tag + '>' + sep + body + sep + '</' + tag + '>' }}
{%- endmacro %}
{%- macro turn(role, content, end='<|im_end|>\n') -%}
    <|im_start|>{{ role }}
{{ content }}{{ end }}
{%- endmacro %}
{{- bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\nYou call functions. Their signatures are inside <tools></tools>:\n<tools>\n' }}
    {%- for tool in tools %}
        {%- if tool.function is defined %}
            {%- set tool = tool.function %}
        {%- endif %}
        {{- '{"type": "function", "function": {"name": "' + tool.name + '", "description": "' + tool.name + '(' }}
        {%- for param_name, param_fields in tool.parameters.properties | items %}
            {{- param_name + ": " + json_to_python_type(param_fields) }}
            {%- if not loop.last %}{{- ", " }}{%- endif %}
        {%- endfor %}
        {{- ")" }}
        {%- if tool.return is defined %}
            {{- " -> " + json_to_python_type(tool.return) }}
        {%- endif %}
        {{- " - " + tool.description | trim + "\n\n" }}
        {%- for param_name, param_fields in tool.parameters.properties | items %}
            {%- if loop.first %}
                {{- "    Args:\n" }}
            {%- endif %}
            {{- "        " + param_name + "(" + json_to_python_type(param_fields) + "): " + param_fields.description | default('') | trim + "\n" }}
        {%- endfor %}
        {{- '", "parameters": ' + tool.parameters | tojson + "}}\n" }}
    {%- endfor %}
    {{- '</tools>\n' + wrap('{"name": <name>, "arguments": <args>}', tag='tool_call') + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == "user" or message.role == "system" or (message.role == "assistant" and message.tool_calls is not defined) %}
        {{- turn(message.role, message.content) }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>assistant' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n' + wrap('{"name": "' + tool_call.name + '", "arguments": ' + tool_call.arguments | tojson + '}', 'tool_call') }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.previtem is not defined or loop.previtem.role != "tool" %}
            {{- '<|im_start|>tool\n' }}
        {%- endif %}
        {{- wrap(message.content) }}
        {%- if loop.last or loop.nextitem.role != "tool" %}
            {{- '<|im_end|>\n' }}
        {%- else %}
            {{- '\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- turn('assistant', '', end='') }}
{%- endif %}
"""

GEMMA3 = r"""{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Roles must alternate between user and assistant") }}
    {%- endif -%}
    {%- if message['role'] == 'assistant' -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{ '<start_of_turn>model\n' }}
{%- endif -%}
"""

LLAMA31 = r"""{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n" }}
{%- endif %}
{{- "Knowledge cutoff: December 2023\nToday: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "These functions are available. Reply with JSON {\"name\": ..., \"parameters\": ...}.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) + "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message + "<|eot_id|>" }}
{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Tools go into the first user message, and there is none") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Answer the question below with a function call, as JSON {\"name\": ..., \"parameters\": ...}.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>" }}
{%- endif %}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if message.tool_calls | length != 1 %}
            {{- raise_exception("Only one tool call per message is supported") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}{{- ", " }}{%- endif %}
            {%- endfor %}
            {{- ")<|eom_id|>" }}
        {%- else %}
            {{- '{"name": "' + tool_call.name + '", "parameters": ' + tool_call.arguments | tojson + "}<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
"""

MISTRAL3 = r"""{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if tools is not defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr('role', 'equalto', 'user') | list %}
{%- set ns = namespace(index=0, last_call='') %}
{%- for message in loop_messages %}
    {%- if not (message.role == 'tool' or message.tool_calls is defined and message.tool_calls is not none) %}
        {%- if (message.role == 'user') != (ns.index % 2 == 0) %}
            {{- raise_exception('After the optional system message, roles must alternate user/assistant') }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message.role == 'user' %}
        {%- if (loop.last or message == user_messages[-1]) and tools is not none and tools|length > 0 %}
            {{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {%- if message == user_messages[-1] and system_message is defined %}
            {{- '[INST] ' + system_message + '\n\n' + message.content + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message.content + '[/INST]' }}
        {%- endif %}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- '[TOOL_CALLS] [' }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.id is not string or tool_call.id|length != 9 %}
                {{- raise_exception('Tool call ids must be strings of 9 characters') }}
            {%- endif %}
            {%- set call = tool_call.function %}
            {{- '{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson + ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ', ' }}{%- endif %}
        {%- endfor %}
        {{- ']' + eos_token }}
        {%- set ns.last_call = message.tool_calls[0].id %}
    {%- elif message.role == 'assistant' %}
        {{- ' ' + message.content | trim + eos_token }}
    {%- elif message.role == 'tool' %}
        {%- set call_id = message.tool_call_id if message.tool_call_id is defined else ns.last_call %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson + ', "call_id": "' + call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception('Unsupported role: ' + message.role) }}
    {%- endif %}
{%- endfor %}
"""

DEEPSEEK3 = r"""{%- if not add_generation_prompt is defined %}{% set add_generation_prompt = false %}{% endif %}
{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='', is_first_sp=true) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if ns.is_first_sp %}
            {%- set ns.system_prompt = ns.system_prompt + message['content'] %}
            {%- set ns.is_first_sp = false %}
        {%- else %}
            {%- set ns.system_prompt = ns.system_prompt + '\n\n' + message['content'] %}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{{ bos_token }}{{ ns.system_prompt }}
{%- for message in messages %}
    {%- if message['role'] == 'user' %}
        {%- set ns.is_tool = false -%}{{ '<｜User｜>' + message['content'] }}
    {%- endif %}
    {%- if message['role'] == 'assistant' and 'tool_calls' in message %}
        {%- set ns.is_tool = false -%}
        {%- for tool in message['tool_calls'] %}
            {%- if not ns.is_first %}
                {%- if message['content'] is none %}
                    {{- '<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>' }}
                {%- else %}
                    {{- '<｜Assistant｜>' + message['content'] + '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>' }}
                {%- endif %}
                {%- set ns.is_first = true -%}
            {%- else %}
                {{- '\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>' }}
            {%- endif %}
        {%- endfor %}
        {{- '<｜tool▁calls▁end｜><｜end▁of▁sentence｜>' }}
    {%- endif %}
    {%- if message['role'] == 'assistant' and 'tool_calls' not in message %}
        {%- if ns.is_tool %}
            {{- '<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>' }}
            {%- set ns.is_tool = false -%}
        {%- else %}
            {%- set content = message['content'] %}
            {%- if '</think>' in content %}
                {%- set content = content.split('</think>')[-1] %}
            {%- endif %}
            {{ '<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>' }}
        {%- endif %}
    {%- endif %}
    {%- if message['role'] == 'tool' %}
        {%- set ns.is_tool = true -%}
        {%- if ns.is_output_first %}
            {{- '<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
            {%- set ns.is_output_first = false %}
        {%- else %}
            {{- '<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>' }}
        {%- endif %}
    {%- endif %}
{%- endfor -%}
{% if ns.is_tool %}{{ '<｜tool▁outputs▁end｜>' }}{% endif %}
{% if add_generation_prompt and not ns.is_tool %}{{ '<｜Assistant｜>' }}{% endif %}"""

FILTERS = r"""{%- set roles = messages | map(attribute='role') | unique | list %}
{%- set n_user = messages | selectattr('role', 'equalto', 'user') | list | length %}
{%- set system %}
You are a helpful assistant.
    This conversation has {{ messages | length }} messages from {{ roles | join('/') }}.
{%- if n_user > 1 %}
    The user has spoken {{ n_user }} times.
{%- endif %}
{% endset %}
{%- set meta = dict(turns=n_user, budget=budget | default('512') | int) %}
<|system|>
{{ system | trim | indent(4) }}
{{ '%s words, budget %s, %s turns' | format(system | wordcount, meta.budget, meta['turns']) }}
{%- for i in range(messages | length) %}
    {%- set message = messages[i] %}
<|{{ message.role }}|> [{{ loop.cycle('odd', 'even') }} {{ i }}/{{ loop.revindex0 }}]
{{ message.content | trim | indent(2, first=true) }}
{%- endfor %}
{%- if add_generation_prompt %}
<|assistant|>
{%- endif %}
"""

INDENTED = """{% for message in messages %}
    {# one block per message #}
    {% if message.role == 'system' %}
        System: {{ message.content }}
    {% elif message.role == 'user' %}
        {% if loop.index > 1 %}
            ---
        {% endif %}
        User: {{- ' ' + message.content -}}   !
    {% else %}
        Assistant: {{ message.content }}{{ ' (end)' if loop.last }}
          {%- if message.content | length > 5 %} long{% endif %}
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
    Assistant:
{% endif %}
"""

Q3_THINK = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "1+1?"},
            {"role": "assistant", "content": "<think>\nsum\n</think>\n\n2"}, {"role": "user", "content": "Times 3?"},
            {"role": "assistant", "content": "6", "reasoning_content": "\n2 * 3\n"}]
Q3_TOOLS = [{"role": "user", "content": "Weather in Zürich and Oslo?"},
            {"role": "assistant", "content": None, "reasoning_content": "Need both cities.", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}},
                {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}]},
            {"role": "tool", "content": "{\"t\": 21.5}"}, {"role": "tool", "content": "{\"t\": -3}"},
            {"role": "assistant", "content": "<think>\ncompare\n</think>\nZürich is warmer."}]
Q3_MULTISTEP = [{"role": "user", "content": "Plan a trip."},
                {"role": "assistant", "content": "Checking.", "tool_calls": [
                    {"function": {"name": "search", "arguments": {"q": "trains"}}}]},
                {"role": "user", "content": "<tool_response>\n3 trains\n</tool_response>"},
                {"role": "assistant", "content": "<think>pick one</think>Take the 9:00 train."}]
PROPS = {"query": {"type": "string", "description": " Free text. "}, "limit": {"type": "integer"},
         "weights": {"type": "array", "items": {"type": "number"}, "description": "Per-field weights"},
         "filters": {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
         "options": {"type": "object"}, "exact": {"type": ["boolean", "null"]}, "raw": {}}
SEARCH = {"type": "function", "function": {
    "name": "search_docs", "description": "Search the docs.  ",
    "parameters": {"type": "object", "properties": PROPS, "required": ["query"]},
    "return": {"type": "array", "items": {"type": "object", "additionalProperties": {"type": "integer"}}}}}
H_TOOLS = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Find 'jinja' in the docs."},
           {"role": "assistant", "tool_calls": [
               {"type": "function", "function": {"name": "search_docs", "arguments": {"query": "jinja", "limit": 2}}},
               {"name": "search_docs", "arguments": {"query": "macro"}}]},
           {"role": "tool", "content": "[{\"hits\": 4}]"}, {"role": "tool", "content": "[]"},
           {"role": "assistant", "content": "Found 4 hits."}]
G3_PARTS = [{"role": "system", "content": [{"type": "text", "text": "Be brief.  "}]},
            {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  What is this?\n"}]},
            {"role": "assistant", "content": "A cat. "}, {"role": "user", "content": [
                {"type": "text", "text": "And these?"}, {"type": "image"}, {"type": "video"}, {"type": "image"}]}]
G3_IMAGES = [{"role": "user", "content": [{"type": "image"}, {"type": "image"}]}]
L31_TOOLS = [{"role": "system", "content": "  Be precise.  "}, {"role": "user", "content": " Weather in Oslo? "},
             {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}}]},
             {"role": "tool", "content": "{\"temp\": 3}"}, {"role": "ipython", "content": {"sky": ["snow", None]}},
             {"role": "assistant", "content": "It is 3 °C."}]
L31_BUILTIN = [{"role": "user", "content": "Search Oslo weather."},
               {"role": "assistant", "tool_calls": [{"function": {
                   "name": "brave_search", "arguments": {"query": "Oslo weather", "lang": "en"}}}]},
               {"role": "ipython", "content": "sunny"}]
M3_TOOLS = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Weather in Oslo?"},
            {"role": "assistant", "tool_calls": [{"id": "abc123XYZ", "type": "function", "function": {
                "name": "get_weather", "arguments": {"city": "Oslo"}}}]},
            {"role": "tool", "tool_call_id": "abc123XYZ", "content": "{\"t\": 3}"},
            {"role": "assistant", "content": " 3 degrees.\n"}, {"role": "user", "content": "Thanks!"}]
M3_TWO_CALLS = [{"role": "user", "content": "Oslo and Rome?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call00001", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
                    {"id": "call00002", "function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
                {"role": "tool", "content": "cold"}, {"role": "tool", "content": "warm"}]
D3_TOOLS = [{"role": "system", "content": "You are helpful."}, {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Oslo and Rome?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}},
                {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}}]},
            {"role": "tool", "content": "cold"}, {"role": "tool", "content": "warm"},
            {"role": "assistant", "content": "Rome is warmer."}, {"role": "user", "content": "And Paris?"}]
D3_CONTENT = [{"role": "user", "content": "Paris?"},
              {"role": "assistant", "content": "Let me check.", "tool_calls": [
                  {"type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
              {"role": "tool", "content": "mild"}]
SHORT = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"}]

CHATS2 = [  # (template name, template, conversations, extra context)
    ("qwen3", QWEN3, {"think": Q3_THINK, "multistep": Q3_MULTISTEP, "user": USER}, {}),
    ("qwen3_tools", QWEN3, {"tools": Q3_TOOLS, "system": SYSTEM}, {"tools": [WEATHER]}),
    ("qwen3_nothink", QWEN3, {"think": Q3_THINK, "user": USER}, {"enable_thinking": False}),
    ("hermes", HERMES, {"tools": H_TOOLS, "multi": MULTI}, {"tools": [SEARCH, WEATHER]}),
    ("hermes_notools", HERMES, {"system": SYSTEM, "user": USER}, {}),
    ("gemma3", GEMMA3, {"parts": G3_PARTS, "system": SYSTEM, "multi": MULTI, "images": G3_IMAGES}, {}),
    ("llama31", LLAMA31, {"system": SYSTEM, "user": USER}, {}),
    ("llama31_tools", LLAMA31, {"chat": L31_TOOLS}, {"tools": [WEATHER]}),
    ("llama31_tools_in_system", LLAMA31, {"chat": L31_TOOLS},
     {"tools": [WEATHER], "tools_in_user_message": False}),
    ("llama31_builtin", LLAMA31, {"builtin": L31_BUILTIN},
     {"builtin_tools": ["code_interpreter", "brave_search", "wolfram_alpha"], "date_string": "01 Mar 2025"}),
    ("mistral3", MISTRAL3, {"tools": M3_TOOLS, "two_calls": M3_TWO_CALLS}, {"tools": [WEATHER]}),
    ("mistral3_notools", MISTRAL3, {"system": SYSTEM, "multi": MULTI}, {"tools": None}),
    ("deepseek3", DEEPSEEK3, {"tools": D3_TOOLS, "content_tools": D3_CONTENT, "think": THINK}, {}),
    ("filters", FILTERS, {"system": SYSTEM, "multi": MULTI, "user": USER}, {}),
    ("filters_budget", FILTERS, {"multi": MULTI}, {"budget": "1024"}),
    ("indented", INDENTED, {"system": SYSTEM, "multi": MULTI, "short": SHORT}, {}),
    ("indented_crlf", INDENTED.replace("\n", "\r\n"), {"system": SYSTEM, "short": SHORT}, {}),
]
for tname, template, convs, extra in CHATS2:
    bos, eos = TOKENS.get(tname.split("_")[0].rstrip("0123456789"), ("<s>", "</s>"))
    for cname, messages in convs.items():
        for gen in (False, True):
            case(f"chat_{tname}_{cname}_{'gen' if gen else 'nogen'}", template, messages=messages,
                 add_generation_prompt=gen, bos_token=bos, eos_token=eos, **extra)
case("chat_llama31_tools_in_user_custom_tools_gen", LLAMA31, messages=L31_TOOLS[:2],
     custom_tools=[WEATHER, SEARCH], add_generation_prompt=True, bos_token="<|begin_of_text|>")
case("chat_deepseek3_no_add_generation_prompt", DEEPSEEK3, messages=D3_CONTENT[:2] + [SHORT[1]],
     bos_token="<｜begin▁of▁sentence｜>")

case("ws_indented_tags_keep_text_indent", "<s>\n{% for m in messages %}\n    {% if m %}\n    {{ m }}\n"
     "    {% endif %}\n{% endfor %}\n</s>\n", messages=["a", "", "b"])
case("ws_mixed_minus_and_plain", "[\n  {{- a }}  {{ b -}}  \n  {{ c }}\n  {%- if true %} {{- d -}} {% endif -%}\n]",
     a=1, b=2, c=3, d=4)
case("ws_crlf_text_and_literals", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n  {%- if true -%}\r\n  c  \r\n"
     "{%- endif %}\r\n{{ 'x\r\ny' }}\r\nz\r\n")
case("ws_trailing_newline_after_endif", "x\n{% if true %}y{% endif %}\n")
case("ws_trailing_two_newlines_after_endif", "x\n{% if true %}\ny\n{% endif %}\n\n")
case("ws_comment_lines_in_loop", "{% for i in [1, 2] %}\n  {{ i }}\n  {# c #}\n    {#- d -#}\n{% endfor %}")

error("error_unknown_test", "a\n{{ 3 is nosuchtest }}")
error("error_macro_too_many_arguments", "{% macro f(a) %}{{ a }}{% endmacro %}\n{{ f(1, 2) }}")
error("error_macro_unknown_keyword", "{% macro f(a) %}{{ a }}{% endmacro %}\n{{ f(1, b=2) }}")
error("error_macro_called_before_defined", "{{ f() }}\n{% macro f() %}x{% endmacro %}")
error("error_loop_outside_loop", "x\n{{ loop.index }}")
error("error_str_no_such_method", "{{ 'a'.nosuch() }}")
error("error_break_outside_loop", "x\n{% break %}")
error("error_continue_outside_loop", "{% if true %}{% continue %}{% endif %}")
error("error_raise_in_macro", "{% macro check(m) %}\n{% if m.role == 'system' %}\n"
      "{{ raise_exception('System role not supported') }}\n{% endif %}\n{% endmacro %}\n"
      "{% for m in messages %}{{ check(m) }}{% endfor %}", messages=[{"role": "system", "content": "x"}])
error("error_chat_gemma3_invalid_content", GEMMA3, messages=[{"role": "user", "content": 42}],
      add_generation_prompt=True, bos_token="<bos>")
error("error_chat_gemma3_none_content", GEMMA3, messages=[{"role": "user", "content": None}],
      add_generation_prompt=False, bos_token="<bos>")
error("error_chat_llama31_two_tool_calls", LLAMA31, messages=[L31_TOOLS[1], M3_TWO_CALLS[1]],
      add_generation_prompt=False, bos_token="<|begin_of_text|>")
error("error_chat_mistral3_short_id", MISTRAL3, messages=[M3_TOOLS[1], {"role": "assistant", "tool_calls": [
    {"id": "abc", "function": {"name": "f", "arguments": {}}}]}], bos_token="<s>", eos_token="</s>")
error("error_chat_mistral3_id_not_string", MISTRAL3, messages=[M3_TOOLS[1], {"role": "assistant", "tool_calls": [
    {"id": 123456789, "function": {"name": "f", "arguments": {}}}]}], bos_token="<s>", eos_token="</s>")
error("error_chat_mistral3_alternation", MISTRAL3, messages=BAD_ORDER, bos_token="<s>", eos_token="</s>")

# ---------------------------------------------------------------- E. what reviews found
D = {"b": 1, "A": 2, "c": 0}
TOOLS = [{"function": {"name": "f", "args": ["x"]}}, {"function": {"name": "g", "args": []}}]
case("e_dictsort", "{% for k, v in d|dictsort %}{{ k }}={{ v }},{% endfor %}|"
     "{{ d|dictsort(by='value') }}|{{ d|dictsort(true) }}|{{ d|dictsort(reverse=true) }}", d=D)
case("e_dotted_attribute", "{{ tools|map(attribute='function.name')|join(',') }}|"
     "{{ tools|selectattr('function.name', 'equalto', 'g')|list|length }}|"
     "{{ tools|map(attribute='function.args.0', default='-')|join(',') }}|"
     "{{ tools|sort(attribute='function.name', reverse=true)|map(attribute='function.name')|join }}",
     tools=TOOLS)
case("e_map_any_filter", "{{ ['a', 'bb']|map('length')|list }} {{ [{'x': 1}]|map('tojson')|list }} "
     "{{ [none, 'y']|map('default', 'z')|list }} {{ ['a b']|map('replace', ' ', '_')|list }}")
case("e_split_rest", "{{ '  a  b  c  '.split(none, 1) }} {{ '  a  b  c  '.rsplit(none, 1) }} "
     "{{ 'aaa'.rsplit('aa', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ 'x'.rsplit('long', 1) }}")
case("e_sort_min_max_sum", "{{ [3, 1, 2]|sort(true) }} {{ ['b', 'A', 'c']|sort }} "
     "{{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ ['a', 'B']|max }} {{ ['a', 'B']|min }} "
     "{{ [1, 2]|sum(start=10) }} {{ ['a', 'A']|unique(case_sensitive=true)|list }} "
     "{{ [{'n': 2}, {'n': 5}]|max(attribute='n') }}")
case("e_round_int_replace", "{{ 2.675|round(2) }} {{ 1234|round(-2) }} {{ 1250|round(-2) }} "
     "{{ 2.5|round }} {{ '0x1A'|int }} {{ '1_000'|int }} {{ ' 12 '|int }} {{ '1e3'|int }} "
     "{{ 'nan'|int(7) }} {{ '3.5'|float }} {{ 'x'|float(1.5) }} {{ 'a1b1'|replace(1, 2) }}")
case("e_tojson_indent_true", "{{ {'a': [1]}|tojson(indent=true) }}")
case("e_format_percent", "{{ '%.2f|%5d|%-4s|%x|%03d|%r'|format(3.14159, 42, 'ab', 255, 7, 'q') }} "
     "{{ 'Hello %s, %d' % ('you', 3) }} {{ '%s!' % who }} {{ '100%%'|format }}", who="Ann")
case("e_generation_scope", "{% generation %}{% set x = 1 %}{{ x }}{% endgeneration %}[{{ x }}]"
     "{% set y %}{% set z = 2 %}{{ z }}{% endset %}[{{ z }}|{{ y }}]")
case("e_break_in_for_else", "{% for a in [1, 2, 3] %}{{ a }}{% for b in [] %}{% else %}"
     "{% if a == 2 %}{% break %}{% endif %}{% endfor %}{% endfor %}")
case("e_indent_first_blank", "[{{ '\nx'|indent(2, true) }}] [{{ 'a\n\nb'|indent(2, blank=true) }}]")
case("e_unicode_whitespace_control", "a\u3000\u00a0{%- if true -%}\u2003b{%- endif %}")
error("e_range_too_big", "{{ range(200000)|length }}")
error("e_zero_negative_power", "{{ 0 ** -1 }}")
error("e_bad_hex_escape", "{{ '\\xZZ' }}")


def main():
    out = []
    names = set()
    for name, template, context in CASES + ERRORS:
        assert name not in names, name
        names.add(name)
    for name, template, context in CASES:
        try:
            expected = _compile_jinja_template(template).render(**context)
        except Exception as e:
            raise AssertionError(f"{name}: {type(e).__name__}: {e}") from e
        out.append({"name": name, "template": template, "context": context, "expected": expected})
    for name, template, context in ERRORS:
        try:
            _compile_jinja_template(template).render(**context)
        except Exception as e:  # compile and render errors alike
            out.append({"name": name, "template": template, "context": context, "error": str(e)})
        else:
            raise AssertionError(f"{name}: rendered without an error")
    os.makedirs(sys.argv[1], exist_ok=True)
    with open(os.path.join(sys.argv[1], "jinja_cases.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(f"wrote {len(out)} cases ({len(ERRORS)} errors)")


if __name__ == "__main__":
    main()
