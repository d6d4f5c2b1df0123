"""Drive a running m40-llm server with the official `openai` and `ollama`
Python clients (from PyPI). Run by crates/m40-serve/tests/http.rs:

    python3 check_clients.py BASE_URL MODEL GGUF_PATH

Exits non-zero, naming the failed check, when the server does not behave as
those clients expect.
"""

import sys

import ollama
import openai

BASE, MODEL, GGUF = sys.argv[1], sys.argv[2], sys.argv[3]
checks = 0


def check(cond, what):
    global checks
    if not cond:
        raise SystemExit(f"FAILED: {what}")
    checks += 1


def expect_error(fn, cls, what, status=None):
    try:
        fn()
    except cls as e:
        code = getattr(e, "status_code", None)
        check(status is None or code == status, f"{what}: status {code}, expected {status}")
        return e
    raise SystemExit(f"FAILED: {what}: no {cls.__name__} raised")


# --- openai ---------------------------------------------------------------
oa = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
ids = [m.id for m in oa.models.list()]
check(MODEL in ids, f"/v1/models lists {MODEL}: {ids}")
check(oa.models.retrieve(MODEL).id == MODEL, "models.retrieve finds the model")

msgs = [{"role": "user", "content": "Name three colors."}]
whole = oa.chat.completions.create(model=MODEL, messages=msgs, temperature=0, max_tokens=12, seed=7)
text = whole.choices[0].message.content
check(text and whole.choices[0].finish_reason in ("stop", "length"), f"chat completion: {whole}")
check(whole.usage.completion_tokens <= 12 and whole.usage.prompt_tokens > 0, f"usage: {whole.usage}")
parts, usage = [], None
for chunk in oa.chat.completions.create(
    model=MODEL, messages=msgs, temperature=0, max_tokens=12, seed=7,
    stream=True, stream_options={"include_usage": True},
):
    if chunk.choices and chunk.choices[0].delta.content:
        parts.append(chunk.choices[0].delta.content)
    if chunk.usage:
        usage = chunk.usage
check("".join(parts) == text, f"streamed chat {''.join(parts)!r} == whole {text!r}")
check(usage is not None and usage.completion_tokens == whole.usage.completion_tokens, f"stream usage {usage}")

comp = oa.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=8, logprobs=2)
check(comp.choices[0].text, f"completion: {comp}")
lp = comp.choices[0].logprobs
check(lp is not None and len(lp.tokens) == len(lp.token_logprobs) > 0, f"completion logprobs: {lp}")
streamed = "".join(
    c.choices[0].text
    for c in oa.completions.create(model=MODEL, prompt="The sky is", temperature=0, max_tokens=8, stream=True)
    if c.choices
)
check(streamed == comp.choices[0].text, f"streamed completion {streamed!r} == {comp.choices[0].text!r}")

# Structured outputs: a JSON schema answer validated with jsonschema.
import json

import jsonschema

pet = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 16}, "legs": {"type": "integer", "minimum": 0, "maximum": 8}},
    "required": ["name", "legs"],
    "additionalProperties": False,
}
ask = [{"role": "user", "content": "Describe a pet as JSON."}]
sc = oa.chat.completions.create(
    model=MODEL, messages=ask, temperature=0, max_tokens=80,
    response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": pet, "strict": True}},
)
jsonschema.validate(json.loads(sc.choices[0].message.content), pet)
check(sc.choices[0].finish_reason == "stop", f"schema answer finished: {sc}")
streamed = "".join(
    c.choices[0].delta.content or ""
    for c in oa.chat.completions.create(
        model=MODEL, messages=ask, temperature=0.9, seed=5, max_tokens=80, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "pet", "schema": pet}},
    )
    if c.choices
)
jsonschema.validate(json.loads(streamed), pet)
checks += 2

# Tools: a loop of two turns (call -> tool result -> answer), whole and
# streamed; the arguments validate against the function's schema.
weather_params = {
    "type": "object",
    "properties": {"city": {"type": "string", "description": "The city", "maxLength": 30}},
    "required": ["city"],
}
weather = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                             "parameters": weather_params}}]
q = [{"role": "user", "content": "What is the weather in Paris?"}]
tc = oa.chat.completions.create(model=MODEL, messages=q, tools=weather, tool_choice="required",
                                temperature=0, max_tokens=100)
calls = tc.choices[0].message.tool_calls
check(tc.choices[0].finish_reason == "tool_calls" and calls, f"a required call: {tc}")
check(all(c.function.name == "get_weather" and c.id for c in calls), f"calls name the function: {calls}")
for c in calls:
    jsonschema.validate(json.loads(c.function.arguments), weather_params)
streamed_calls = {}
for chunk in oa.chat.completions.create(model=MODEL, messages=q, tools=weather, tool_choice="required",
                                        temperature=0, max_tokens=100, stream=True):
    for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
        s_call = streamed_calls.setdefault(d.index, {"name": "", "arguments": ""})
        s_call["name"] += d.function.name or ""
        s_call["arguments"] += d.function.arguments or ""
check([c["name"] for c in streamed_calls.values()] == [c.function.name for c in calls]
      and [json.loads(c["arguments"]) for c in streamed_calls.values()]
      == [json.loads(c.function.arguments) for c in calls], f"streamed calls {streamed_calls} == {calls}")
turn2 = q + [tc.choices[0].message.model_dump(exclude_none=True)] + [
    {"role": "tool", "tool_call_id": c.id, "content": "21 C and sunny"} for c in calls]
ans = oa.chat.completions.create(model=MODEL, messages=turn2, tools=weather, tool_choice="none",
                                 temperature=0, max_tokens=30)
check(ans.choices[0].message.content and not ans.choices[0].message.tool_calls, f"the answer after the result: {ans}")

expect_error(lambda: oa.chat.completions.create(model="no-such-model", messages=msgs),
             openai.NotFoundError, "unknown model", 404)
e = expect_error(lambda: oa.completions.create(model=MODEL, prompt="word " * 5000, max_tokens=4),
                 openai.BadRequestError, "prompt longer than the context", 400)
check("context" in str(e), f"the error names the context: {e}")

# --- ollama ---------------------------------------------------------------
ol = ollama.Client(host=BASE)
names = [m.model for m in ol.list().models]
check(MODEL in names, f"/api/tags lists {MODEL}: {names}")
info = ol.show(MODEL)
check(info.details.format == "gguf" and info.modelinfo, f"show: {info}")
check(any(m.model == MODEL for m in ol.ps().models), "ps lists the model")

opts = {"temperature": 0, "num_predict": 10, "seed": 3}
g = ol.generate(model=MODEL, prompt="Once upon a time", options=opts)
check(g.done and g.response and g.eval_count <= 10 and g.total_duration > 0, f"generate: {g}")
gs = "".join(p.response for p in ol.generate(model=MODEL, prompt="Once upon a time", options=opts, stream=True))
check(gs == g.response, f"streamed generate {gs!r} == {g.response!r}")
c = ol.chat(model=MODEL, messages=msgs, options=opts)
check(c.message.role == "assistant" and c.message.content, f"chat: {c}")
cs = "".join(p.message.content for p in ol.chat(model=MODEL, messages=msgs, options=opts, stream=True))
check(cs == c.message.content, f"streamed chat {cs!r} == {c.message.content!r}")
oc = ol.chat(model=MODEL, messages=ask, format=pet, options={"temperature": 0, "num_predict": 80})
jsonschema.validate(json.loads(oc.message.content), pet)
og = ol.generate(model=MODEL, prompt="Describe a pet as JSON.", format=pet, options={"temperature": 0.7, "seed": 2, "num_predict": 80})
jsonschema.validate(json.loads(og.response), pet)
checks += 2
# Tools through the ollama client: a Python function as the tool, the
# call, its result with tool_name, the next turn.
def get_weather(city: str) -> str:
    """Current weather in a city.

    Args:
      city: The city
    """
    return "21 C and sunny"


oq = [{"role": "user", "content": "Use get_weather to find the weather in Paris."}]
ot = ol.chat(model=MODEL, messages=oq, tools=[get_weather], options={"temperature": 0, "num_predict": 100})
# (Greedy SmolLM2 calls here; Ollama has no tool_choice to force it.)
check(ot.message.tool_calls, f"ollama tools: {ot}")
for call in ot.message.tool_calls:
    check(call.function.name == "get_weather", f"ollama call: {call}")
    jsonschema.validate(dict(call.function.arguments), weather_params)
call = ot.message.tool_calls[0]
oq2 = oq + [ot.message, {"role": "tool", "tool_name": call.function.name,
                         "content": get_weather(**call.function.arguments)}]
o2 = ol.chat(model=MODEL, messages=oq2, tools=[get_weather], options={"temperature": 0, "num_predict": 60})
check(o2.message.content or o2.message.tool_calls, f"ollama turn after the result: {o2}")
ost = list(ol.chat(model=MODEL, messages=oq, tools=[get_weather], stream=True,
                   options={"temperature": 0, "num_predict": 100}))
check(sum(len(p.message.tool_calls or []) for p in ost) == len(ot.message.tool_calls or []),
      f"streamed ollama calls: {ost}")

expect_error(lambda: ol.chat(model=MODEL, messages=ask, format={"type": "array", "uniqueItems": True}),
             ollama.ResponseError, "an unsupported schema", 400)
expect_error(lambda: ol.generate(model="no-such-model", prompt="hi"), ollama.ResponseError, "unknown model", 404)
expect_error(lambda: ol.generate(model=MODEL, prompt="hi", options={"temperature": "hot"}),
             ollama.ResponseError, "a wrong option type", 400)

# embeddings: both clients, as a RAG front-end asks for them
import base64, math, struct
oe = oa.embeddings.create(model=MODEL, input=["the sky is blue", "cats purr"])
check(len(oe.data) == 2 and len(oe.data[0].embedding) == 576 and oe.usage.prompt_tokens > 0,
      f"openai embeddings: {len(oe.data)}")
check(abs(math.hypot(*oe.data[0].embedding) - 1) < 1e-4, "openai embeddings are normalized")
raw = oa.embeddings.create(model=MODEL, input="the sky is blue", encoding_format="base64")
floats = struct.unpack(f"<{len(base64.b64decode(raw.data[0].embedding)) // 4}f",
                       base64.b64decode(raw.data[0].embedding))
check(max(abs(a - b) for a, b in zip(floats, oe.data[0].embedding)) < 1e-5, "base64 embeddings")
oe2 = oa.embeddings.create(model=MODEL, input="the sky is blue", dimensions=64)
check(len(oe2.data[0].embedding) == 64, "openai dimensions")
le = ol.embed(model=MODEL, input=["the sky is blue", "cats purr"])
check(len(le.embeddings) == 2 and max(abs(a - b) for a, b in zip(le.embeddings[0], oe.data[0].embedding)) < 1e-5,
      "ollama embed matches openai's")
check(len(ol.embeddings(model=MODEL, prompt="the sky is blue").embedding) == 576, "ollama embeddings (older)")

# pull (a path, named in place), list, delete
steps = [p.status for p in ol.pull(GGUF, stream=True)]
check(steps and steps[0] == "pulling manifest" and steps[-1] == "success", f"pull progress: {steps}")
pulled = [m.model for m in ol.list().models if m.model != MODEL]
check(len(pulled) == 1, f"the pulled model is listed: {pulled}")
shown = ol.show(pulled[0])
check(shown.details.family == "llama" and shown.modelinfo["llama.block_count"] == 30, f"show a stored model: {shown}")
# create (a customised model over the pulled one), its defaults applied,
# copy, show, ps with both models loaded, delete
st = ol.create(model="pirate", from_=pulled[0], system="You are a pirate.",
               parameters={"num_predict": 3, "temperature": 0})
check(st.status == "success", f"create: {st}")
pg = ol.generate(model="pirate", prompt="Hi")
check(pg.eval_count == 3, f"the created model's num_predict: {pg}")
spelled = ol.generate(model=MODEL, prompt="Hi", system="You are a pirate.",
                      options={"num_predict": 3, "temperature": 0})
check(pg.response == spelled.response, f"its system prompt: {pg.response!r} == {spelled.response!r}")
loaded = sorted(m.model for m in ol.ps().models)
check("pirate:latest" in loaded or "pirate" in loaded, f"ps lists both loaded models: {loaded}")
check(ol.copy("pirate", "pirate2").status == "success", "copy")
sp = ol.show("pirate2")
check("SYSTEM" in sp.modelfile and "pirate" in sp.modelfile and "num_predict" in sp.parameters,
      f"show a copy: {sp}")
check(sp.capabilities and "completion" in sp.capabilities, f"capabilities: {sp.capabilities}")
for name in ["pirate", "pirate2"]:
    check(ol.delete(name).status == "success", f"delete {name}")
check(ol.delete(pulled[0]).status == "success", "delete")
check(all(m.model == MODEL for m in ol.list().models), "deleted models leave the list")
expect_error(lambda: ol.delete("no-such-model"), ollama.ResponseError, "deleting an unknown model", 404)

print(f"openai {openai.__version__}, ollama python client: {checks} checks passed")
