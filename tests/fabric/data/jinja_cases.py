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

Three groups: single constructs, each isolating one feature (printing of values, whitespace
control, loops, scoping, operators, filters, tests, str and dict methods); error cases; and
original chat templates written in the style of the Llama 3.1, Qwen2.5, Mistral, Gemma, Phi-3,
DeepSeek and Zephyr ones, each rendered over several conversations with and without
add_generation_prompt. No case calls strftime_now, so the output does not depend on the date.
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
