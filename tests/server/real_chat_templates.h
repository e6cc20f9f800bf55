#pragma once
// Real chat templates for the server tests: the "chat_template" values of the models'
// tokenizer_config.json, kept as the JSON string (escapes and all) so that the test data is the
// file's own text; template_text() decodes one. k_mistral_tools is the exception: written here
// after Mistral's published v3 tool format (see its comment).
#include <nlohmann/json.hpp>

#include <string>

namespace sieve::server::templates {

// meta-llama/Llama-2-7b-chat-hf (same in -13b/-70b-chat-hf)
inline const char* const k_llama2 =
    R"tpl("{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% se)tpl"
    R"tpl(t system_message = messages[0]['content'] %}{% else %}{% set loop_messages = message)tpl"
    R"tpl(s %}{% set system_message = false %}{% endif %}{% for message in loop_messages %}{% )tpl"
    R"tpl(if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conve)tpl"
    R"tpl(rsation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if )tpl"
    R"tpl(loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + syste)tpl"
    R"tpl(m_message + '\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = me)tpl"
    R"tpl(ssage['content'] %}{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INS)tpl"
    R"tpl(T] ' + content.strip() + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' )tpl"
    R"tpl('  + content.strip() + ' ' + eos_token }}{% endif %}{% endfor %}")tpl";

// meta-llama/Meta-Llama-3-8B-Instruct
inline const char* const k_llama3 =
    R"tpl("{% set loop_messages = messages %}{% for message in loop_messages %}{% set content )tpl"
    R"tpl(= '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['conten)tpl"
    R"tpl(t'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + co)tpl"
    R"tpl(ntent %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|star)tpl"
    R"tpl(t_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")tpl";

// meta-llama/Llama-3.1-8B-Instruct (Llama 3.3 ships the same text)
inline const char* const k_llama31 =
    R"tpl("{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_too)tpl"
    R"tpl(ls %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set too)tpl"
    R"tpl(ls_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n  )tpl"
    R"tpl(  {%- set date_string = \"26 Jul 2024\" %}\n{%- endif %}\n{%- if not tools is define)tpl"
    R"tpl(d %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the syste)tpl"
    R"tpl(m message, so we can slot it into the right place. #}\n{%- if messages[0]['role'] ==)tpl"
    R"tpl( 'system' %}\n    {%- set system_message = messages[0]['content']|trim %}\n    {%- s)tpl"
    R"tpl(et messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = \"\" %}\n{%)tpl"
    R"tpl(- endif %}\n\n{#- System message + builtin tools #}\n{{- \"<|start_header_id|>system)tpl"
    R"tpl(<|end_header_id|>\\n\\n\" }}\n{%- if builtin_tools is defined or tools is not none %)tpl"
    R"tpl(}\n    {{- \"Environment: ipython\\n\" }}\n{%- endif %}\n{%- if builtin_tools is def)tpl"
    R"tpl(ined %}\n    {{- \"Tools: \" + builtin_tools | reject('equalto', 'code_interpreter'))tpl"
    R"tpl( | join(\", \") + \"\\n\\n\"}}\n{%- endif %}\n{{- \"Cutting Knowledge Date: December)tpl"
    R"tpl( 2023\\n\" }}\n{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n{%- if tools is n)tpl"
    R"tpl(ot none and not tools_in_user_message %}\n    {{- \"You have access to the following)tpl"
    R"tpl( functions. To call a function, please respond with JSON for a function call.\" }}\n)tpl"
    R"tpl(    {{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary )tpl"
    R"tpl(of argument name and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n  )tpl"
    R"tpl(  {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\")tpl"
    R"tpl( }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- \"<|eot_id|>\" }}\n)tpl"
    R"tpl(\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if )tpl"
    R"tpl(tools_in_user_message and not tools is none %}\n    {#- Extract the first user messa)tpl"
    R"tpl(ge so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- s)tpl"
    R"tpl(et first_user_message = messages[0]['content']|trim %}\n        {%- set messages = m)tpl"
    R"tpl(essages[1:] %}\n    {%- else %}\n        {{- raise_exception(\"Cannot put tools in t)tpl"
    R"tpl(he first user message when there's no first user message!\") }}\n{%- endif %}\n    {)tpl"
    R"tpl({- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}\n    {{- \"Given the followi)tpl"
    R"tpl(ng functions, please respond with a JSON for a function call \" }}\n    {{- \"with i)tpl"
    R"tpl(ts proper arguments that best answers the given prompt.\\n\\n\" }}\n    {{- 'Respond)tpl"
    R"tpl( in the format {\"name\": function name, \"parameters\": dictionary of argument name)tpl"
    R"tpl( and its value}.' }}\n    {{- \"Do not use variables.\\n\\n\" }}\n    {%- for t in t)tpl"
    R"tpl(ools %}\n        {{- t | tojson(indent=4) }}\n        {{- \"\\n\\n\" }}\n    {%- end)tpl"
    R"tpl(for %}\n    {{- first_user_message + \"<|eot_id|>\"}}\n{%- endif %}\n\n{%- for messa)tpl"
    R"tpl(ge in messages %}\n    {%- if not (message.role == 'ipython' or message.role == 'too)tpl"
    R"tpl(l' or 'tool_calls' in message) %}\n        {{- '<|start_header_id|>' + message['role)tpl"
    R"tpl('] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n    {%-)tpl"
    R"tpl( elif 'tool_calls' in message %}\n        {%- if not message.tool_calls|length == 1 )tpl"
    R"tpl(%}\n            {{- raise_exception(\"This model only supports single tool-calls at )tpl"
    R"tpl(once!\") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0])tpl"
    R"tpl(.function %}\n        {%- if builtin_tools is defined and tool_call.name in builtin_)tpl"
    R"tpl(tools %}\n            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\)tpl"
    R"tpl(n            {{- \"<|python_tag|>\" + tool_call.name + \".call(\" }}\n            {%)tpl"
    R"tpl(- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_n)tpl"
    R"tpl(ame + '=\"' + arg_val + '\"' }}\n                {%- if not loop.last %}\n          )tpl"
    R"tpl(          {{- \", \" }}\n                {%- endif %}\n                {%- endfor %})tpl"
    R"tpl(\n            {{- \")\" }}\n        {%- else  %}\n            {{- '<|start_header_id)tpl"
    R"tpl(|>assistant<|end_header_id|>\\n\\n' -}}\n            {{- '{\"name\": \"' + tool_call)tpl"
    R"tpl(.name + '\", ' }}\n            {{- '\"parameters\": ' }}\n            {{- tool_call.)tpl"
    R"tpl(arguments | tojson }}\n            {{- \"}\" }}\n        {%- endif %}\n        {%- i)tpl"
    R"tpl(f builtin_tools is defined %}\n            {#- This means we're in ipython mode #}\n)tpl"
    R"tpl(            {{- \"<|eom_id|>\" }}\n        {%- else %}\n            {{- \"<|eot_id|>)tpl"
    R"tpl(\" }}\n        {%- endif %}\n    {%- elif message.role == \"tool\" or message.role =)tpl"
    R"tpl(= \"ipython\" %}\n        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" )tpl"
    R"tpl(}}\n        {%- if message.content is mapping or message.content is iterable %}\n   )tpl"
    R"tpl(         {{- message.content | tojson }}\n        {%- else %}\n            {{- messa)tpl"
    R"tpl(ge.content }}\n        {%- endif %}\n        {{- \"<|eot_id|>\" }}\n    {%- endif %})tpl"
    R"tpl(\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|start_header_id|>assist)tpl"
    R"tpl(ant<|end_header_id|>\\n\\n' }}\n{%- endif %}\n")tpl";

// mistralai/Mistral-7B-Instruct-v0.1
inline const char* const k_mistral_v01 =
    R"tpl("{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (l)tpl"
    R"tpl(oop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/as)tpl"
    R"tpl(sistant/user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INS)tpl"
    R"tpl(T] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{)tpl"
    R"tpl( message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and )tpl"
    R"tpl(assistant roles are supported!') }}{% endif %}{% endfor %}")tpl";

// mistralai/Mistral-7B-Instruct-v0.2, the 2024 revision with an optional system message
inline const char* const k_mistral_v02 =
    R"tpl("{%- if messages[0]['role'] == 'system' %}\n    {%- set system_message = messages[0])tpl"
    R"tpl(['content'] %}\n    {%- set loop_messages = messages[1:] %}\n{%- else %}\n    {%- se)tpl"
    R"tpl(t loop_messages = messages %}\n{%- endif %}\n\n{{- bos_token }}\n{%- for message in )tpl"
    R"tpl(loop_messages %}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %)tpl"
    R"tpl(}\n        {{- raise_exception('After the optional system message, conversation role)tpl"
    R"tpl(s must alternate user/assistant/user/assistant/...') }}\n    {%- endif %}\n    {%- i)tpl"
    R"tpl(f message['role'] == 'user' %}\n        {%- if loop.first and system_message is defi)tpl"
    R"tpl(ned %}\n            {{- ' [INST] ' + system_message + '\\n\\n' + message['content'] )tpl"
    R"tpl(+ ' [/INST]' }}\n        {%- else %}\n            {{- ' [INST] ' + message['content')tpl"
    R"tpl(] + ' [/INST]' }}\n        {%- endif %}\n    {%- elif message['role'] == 'assistant')tpl"
    R"tpl( %}\n        {{- ' ' + message['content'] + eos_token}}\n    {%- else %}\n        {{)tpl"
    R"tpl(- raise_exception('Only user and assistant roles are supported, with the exception o)tpl"
    R"tpl(f an initial optional system message!') }}\n    {%- endif %}\n{%- endfor %}\n")tpl";

// Qwen/Qwen2-7B-Instruct
inline const char* const k_qwen2 =
    R"tpl("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %)tpl"
    R"tpl(}{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}{{'<)tpl"
    R"tpl(|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{%)tpl"
    R"tpl( endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")tpl";

// Qwen/Qwen2.5-7B-Instruct (the other Qwen2.5 Instruct sizes ship the same text): ChatML with
// a default system message and a tools section.
inline const char* const k_qwen25 =
    R"tpl("{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0]['role'] =)tpl"
    R"tpl(= 'system' %}\n        {{- messages[0]['content'] }}\n    {%- else %}\n        {{- 'Yo)tpl"
    R"tpl(u are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n    {%- endif )tpl"
    R"tpl(%}\n    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the)tpl"
    R"tpl( user query.\\n\\nYou are provided with function signatures within <tools></tools> XML)tpl"
    R"tpl( tags:\\n<tools>\" }}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {)tpl"
    R"tpl({- tool | tojson }}\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function c)tpl"
    R"tpl(all, return a json object with function name and arguments within <tool_call></tool_ca)tpl"
    R"tpl(ll> XML tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args)tpl"
    R"tpl(-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0][')tpl"
    R"tpl(role'] == 'system' %}\n        {{- '<|im_start|>system\\n' + messages[0]['content'] + )tpl"
    R"tpl('<|im_end|>\\n' }}\n    {%- else %}\n        {{- '<|im_start|>system\\nYou are Qwen, c)tpl"
    R"tpl(reated by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n    {%- endif )tpl"
    R"tpl(%}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\")tpl"
    R"tpl() or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\")tpl"
    R"tpl( and not message.tool_calls) %}\n        {{- '<|im_start|>' + message.role + '\\n' + m)tpl"
    R"tpl(essage.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %)tpl"
    R"tpl(}\n        {{- '<|im_start|>' + message.role }}\n        {%- if message.content %}\n  )tpl"
    R"tpl(          {{- '\\n' + message.content }}\n        {%- endif %}\n        {%- for tool_c)tpl"
    R"tpl(all in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n   )tpl"
    R"tpl(             {%- set tool_call = tool_call.function %}\n            {%- endif %}\n    )tpl"
    R"tpl(        {{- '\\n<tool_call>\\n{\"name\": \"' }}\n            {{- tool_call.name }}\n  )tpl"
    R"tpl(          {{- '\", \"arguments\": ' }}\n            {{- tool_call.arguments | tojson })tpl"
    R"tpl(}\n            {{- '}\\n</tool_call>' }}\n        {%- endfor %}\n        {{- '<|im_end)tpl"
    R"tpl(|>\\n' }}\n    {%- elif message.role == \"tool\" %}\n        {%- if (loop.index0 == 0))tpl"
    R"tpl( or (messages[loop.index0 - 1].role != \"tool\") %}\n            {{- '<|im_start|>user)tpl"
    R"tpl(' }}\n        {%- endif %}\n        {{- '\\n<tool_response>\\n' }}\n        {{- messag)tpl"
    R"tpl(e.content }}\n        {{- '\\n</tool_response>' }}\n        {%- if loop.last or (messa)tpl"
    R"tpl(ges[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}\n       )tpl"
    R"tpl( {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {)tpl"
    R"tpl({- '<|im_start|>assistant\\n' }}\n{%- endif %}\n")tpl";

// Qwen/Qwen3-8B (the first release of the Qwen3 dense models): Qwen2.5's tools section, no
// default system message, <think> reasoning kept only after the last user query, and
// enable_thinking=false opening an empty think block.
inline const char* const k_qwen3 =
    R"tpl("{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n    {%- if messages[0].role == ')tpl"
    R"tpl(system' %}\n        {{- messages[0].content + '\\n\\n' }}\n    {%- endif %}\n    {{- \)tpl"
    R"tpl("# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nY)tpl"
    R"tpl(ou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" )tpl"
    R"tpl(}}\n    {%- for tool in tools %}\n        {{- \"\\n\" }}\n        {{- tool | tojson }})tpl"
    R"tpl(\n    {%- endfor %}\n    {{- \"\\n</tools>\\n\\nFor each function call, return a json )tpl"
    R"tpl(object with function name and arguments within <tool_call></tool_call> XML tags:\\n<to)tpl"
    R"tpl(ol_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</)tpl"
    R"tpl(tool_call><|im_end|>\\n\" }}\n{%- else %}\n    {%- if messages[0].role == 'system' %}\)tpl"
    R"tpl(n        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n    {)tpl"
    R"tpl(%- endif %}\n{%- endif %}\n{%- set ns = namespace(multi_step_tool=true, last_query_ind)tpl"
    R"tpl(ex=messages|length - 1) %}\n{%- for message in messages[::-1] %}\n    {%- set index = )tpl"
    R"tpl((messages|length - 1) - loop.index0 %}\n    {%- if ns.multi_step_tool and message.role)tpl"
    R"tpl( == \"user\" and not(message.content.startswith('<tool_response>') and message.content)tpl"
    R"tpl(.endswith('</tool_response>')) %}\n        {%- set ns.multi_step_tool = false %}\n    )tpl"
    R"tpl(    {%- set ns.last_query_index = index %}\n    {%- endif %}\n{%- endfor %}\n{%- for m)tpl"
    R"tpl(essage in messages %}\n    {%- if (message.role == \"user\") or (message.role == \"sys)tpl"
    R"tpl(tem\" and not loop.first) %}\n        {{- '<|im_start|>' + message.role + '\\n' + mess)tpl"
    R"tpl(age.content + '<|im_end|>' + '\\n' }}\n    {%- elif message.role == \"assistant\" %}\n)tpl"
    R"tpl(        {%- set content = message.content %}\n        {%- set reasoning_content = '' %)tpl"
    R"tpl(}\n        {%- if message.reasoning_content is defined and message.reasoning_content i)tpl"
    R"tpl(s not none %}\n            {%- set reasoning_content = message.reasoning_content %}\n )tpl"
    R"tpl(       {%- else %}\n            {%- if '</think>' in message.content %}\n             )tpl"
    R"tpl(   {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n         )tpl"
    R"tpl(       {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n').)tpl"
    R"tpl(split('<think>')[-1].lstrip('\\n') %}\n            {%- endif %}\n        {%- endif %}\)tpl"
    R"tpl(n        {%- if loop.index0 > ns.last_query_index %}\n            {%- if loop.last or )tpl"
    R"tpl((not loop.last and reasoning_content) %}\n                {{- '<|im_start|>' + message)tpl"
    R"tpl(.role + '\\n<think>\\n' + reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + conte)tpl"
    R"tpl(nt.lstrip('\\n') }}\n            {%- else %}\n                {{- '<|im_start|>' + mes)tpl"
    R"tpl(sage.role + '\\n' + content }}\n            {%- endif %}\n        {%- else %}\n       )tpl"
    R"tpl(     {{- '<|im_start|>' + message.role + '\\n' + content }}\n        {%- endif %}\n   )tpl"
    R"tpl(     {%- if message.tool_calls %}\n            {%- for tool_call in message.tool_calls)tpl"
    R"tpl( %}\n                {%- if (loop.first and content) or (not loop.first) %}\n         )tpl"
    R"tpl(           {{- '\\n' }}\n                {%- endif %}\n                {%- if tool_cal)tpl"
    R"tpl(l.function %}\n                    {%- set tool_call = tool_call.function %}\n        )tpl"
    R"tpl(        {%- endif %}\n                {{- '<tool_call>\\n{\"name\": \"' }}\n          )tpl"
    R"tpl(      {{- tool_call.name }}\n                {{- '\", \"arguments\": ' }}\n           )tpl"
    R"tpl(     {%- if tool_call.arguments is string %}\n                    {{- tool_call.argume)tpl"
    R"tpl(nts }}\n                {%- else %}\n                    {{- tool_call.arguments | toj)tpl"
    R"tpl(son }}\n                {%- endif %}\n                {{- '}\\n</tool_call>' }}\n     )tpl"
    R"tpl(       {%- endfor %}\n        {%- endif %}\n        {{- '<|im_end|>\\n' }}\n    {%- el)tpl"
    R"tpl(if message.role == \"tool\" %}\n        {%- if loop.first or (messages[loop.index0 - 1)tpl"
    R"tpl(].role != \"tool\") %}\n            {{- '<|im_start|>user' }}\n        {%- endif %}\n )tpl"
    R"tpl(       {{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\)tpl"
    R"tpl(n</tool_response>' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != )tpl"
    R"tpl(\"tool\") %}\n            {{- '<|im_end|>\\n' }}\n        {%- endif %}\n    {%- endif )tpl"
    R"tpl(%}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n')tpl"
    R"tpl( }}\n    {%- if enable_thinking is defined and enable_thinking is false %}\n        {{)tpl"
    R"tpl(- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}\n{%- endif %}")tpl";

// google/gemma-7b-it (google/gemma-2-9b-it has the same text)
inline const char* const k_gemma =
    R"tpl("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System r)tpl"
    R"tpl(ole not supported') }}{% endif %}{% for message in messages %}{% if (message['role'])tpl"
    R"tpl( == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must )tpl"
    R"tpl(alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] ==)tpl"
    R"tpl( 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{%)tpl"
    R"tpl( endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_t)tpl"
    R"tpl(urn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% e)tpl"
    R"tpl(ndif %}")tpl";

// microsoft/Phi-3-mini-4k-instruct (revision of 2024-05)
inline const char* const k_phi3 =
    R"tpl("{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' +)tpl"
    R"tpl( message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}{{'<|user|>\n)tpl"
    R"tpl(' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}{{'<|)tpl"
    R"tpl(assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}{% if add_)tpl"
    R"tpl(generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}")tpl";

// HuggingFaceH4/zephyr-7b-beta
inline const char* const k_zephyr =
    R"tpl("{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' )tpl"
    R"tpl(+ message['content'] + eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|s)tpl"
    R"tpl(ystem|>\n' + message['content'] + eos_token }}\n{% elif message['role'] == 'assistan)tpl"
    R"tpl(t' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n{% endif %}\n{% if)tpl"
    R"tpl( loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endf)tpl"
    R"tpl(or %}")tpl";

inline std::string template_text(const char* json_string) {
  return nlohmann::json::parse(json_string).get<std::string>();
}

// Mistral's v3 tool format (Mistral-7B-Instruct-v0.3, Mistral-Nemo), written after
// mistral-common's tokenizer docs rather than copied: the tools as one JSON list in
// [AVAILABLE_TOOLS] just before the last user turn, the system message prepended to that turn,
// an assistant's calls as [TOOL_CALLS] + a JSON list of {"name", "arguments", "id"} and each
// result as [TOOL_RESULTS] {"content", "call_id"}[/TOOL_RESULTS]. Plain Jinja (not a JSON string).
inline const char* const k_mistral_tools = R"tpl({%- set ns = namespace(last_user=-1, system='') %}
{%- for message in messages %}
    {%- if message.role == 'user' %}{% set ns.last_user = loop.index0 %}{% endif %}
    {%- if message.role == 'system' %}{% set ns.system = message.content %}{% endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message.role == 'user' %}
        {%- if tools and loop.index0 == ns.last_user %}
            {{- '[AVAILABLE_TOOLS] ' + tools | tojson + '[/AVAILABLE_TOOLS]' }}
        {%- endif %}
        {%- if ns.system and loop.index0 == ns.last_user %}
            {{- '[INST] ' + ns.system + '

' + message.content + '[/INST]' }}
        {%- else %}
            {{- '[INST] ' + message.content + '[/INST]' }}
        {%- endif %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '[TOOL_CALLS] [' }}
        {%- for call in message.tool_calls %}
            {{- '{"name": "' + call.function.name + '", "arguments": ' }}
            {{- call.function.arguments | tojson + ', "id": "' + call.id + '"}' }}
            {%- if not loop.last %}{{ ', ' }}{% endif %}
        {%- endfor %}
        {{- ']' + eos_token }}
    {%- elif message.role == 'assistant' %}
        {{- ' ' + message.content + eos_token }}
    {%- elif message.role == 'tool' %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content | tojson }}
        {{- ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %})tpl";

}  // namespace sieve::server::templates
