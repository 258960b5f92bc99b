"""``ctxkit serve`` fuzzed from its own OpenAPI schema (schemathesis) and from raw bytes.

For a classification, an NER and a QA run (the real packaged checkpoint cut to 2 layers,
with a seeded head, no training), schemathesis loads ``/openapi.json`` from the app and, for every
operation, sends bodies generated from the schema (positive mode: they must be answered)
and bodies that violate it (negative mode: they must be refused). Every answer must be a
JSON answer, never a 5xx, that conforms to the schema (status code, content type, body);
every refusal a 4xx ``{"error": "<message>"}``; and negative bodies must be refused, so
the schema is no looser than the server (and positive ones answered: no stricter, but for
the two rules the schema states in words only: 'pairs' as long as 'texts', and a text
must keep a token through the tokenizer, which the test checks with the tokenizer). A
second, schema-blind fuzzer sends arbitrary bytes, JSON values and content types, and a
table pins the answers to JSON oddities (NaN, huge numbers, deep nesting, BOMs ...).

The app runs in-process on schemathesis' ASGI transport, which runs the app's lifespan,
so requests go through the micro-batchers as in production. Deterministic
(``derandomize``, no example database) and bounded (``max_examples``).
"""

import collections
import json
import re

import pytest
import torch

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis", minversion="4.0")

from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.python import asgi as schemathesis_asgi  # noqa: E402

from ctxkit.inference.serve import create_app  # noqa: E402
from ctxkit.inference.serve_schema import NOT_BLANK  # noqa: E402
from ctxkit.tasks import get_task  # noqa: E402
from ctxkit.zoo import get_model  # noqa: E402

CONLL_TAGS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC"]
# Small limits: the generators reach them (and cross them in negative mode), and every
# forward pass stays short.
MAX_ITEMS, MAX_TEXT_CHARS = 4, 48
POSITIVE, NEGATIVE = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
EXAMPLES = {POSITIVE: 40, NEGATIVE: 40}  # per operation and run
REFUSALS = {400, 413, 415, 422}  # what the server answers a bad body with (docs/serving.md)
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
CONFIG = schemathesis.Config.from_dict({"checks": {"negative_data_rejection": {"expected-statuses": sorted(map(str, REFUSALS))}}})
SETTINGS = {"derandomize": True, "database": None, "deadline": None, "print_blob": False, "suppress_health_check": list(HealthCheck)}
TASKS = {"classify": lambda: get_task("table", labels=["negative", "positive"], regression=False),
         "ner": lambda: get_task("conll2003", labels=CONLL_TAGS),
         "qa": lambda: get_task("squad")}


@pytest.fixture(scope="module")
def encoder(minilm_layers, one_thread):
    """The real checkpoint's first 2 layers (its depth plays no part in what the server
    answers; as in test_serve.py), loaded once; the three runs share it (read-only). One torch
    thread: the requests are one to four short texts, and on a shared 2-core machine a
    second thread makes each forward pass wait for a busy core (~50x slower)."""
    return get_model(str(minilm_layers(2)))


@pytest.fixture(scope="module", params=sorted(TASKS))
def served(request, encoder, minilm_layers):
    """``(kind, app, schema)``: the app of a ``kind`` run and its schema, loaded from it.

    The run is what ``load_run`` returns for a folder from ``test_serve._make_run`` (a
    seeded head on the real encoder), built in memory: saving and loading three
    checkpoints would take most of this module's time budget.
    """
    kind, task = request.param, TASKS[request.param]()
    torch.manual_seed(0)
    model = task.build_model(encoder[0])
    with torch.no_grad():
        for p in model.head.parameters():
            p.normal_(0.0, 0.5)
    loaded = (task, model.eval(), encoder[1], {"task": task.name, "options": task.options(), "model": str(minilm_layers(2))})
    app = create_app(loaded, max_wait_ms=0, max_items=MAX_ITEMS, max_text_chars=MAX_TEXT_CHARS)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=CONFIG)
    yield kind, app, schema
    # Ends the lifespan (the batchers drain). schemathesis' pytest plugin also does so
    # after each test; a later request starts it again.
    schemathesis_asgi.shutdown_lifespans()


def _assert_answer(response) -> object:
    """Not a 5xx, a JSON body, and a refusal is ``{"error": "<message>"}``; returns the body."""
    assert response.status_code < 500, (response.status_code, response.content)
    content_type = response.headers.get("content-type") or ""
    content_type = content_type[0] if isinstance(content_type, list) else content_type  # schemathesis: a list per header
    assert content_type == "application/json", (response.status_code, response.headers, response.content)
    assert response.content, f"empty body with status {response.status_code}"
    try:
        body = json.loads(response.content)
    except ValueError:
        raise AssertionError(f"not JSON with status {response.status_code}: {response.content[:200]!r}") from None
    if response.status_code >= 400:
        assert response.status_code in REFUSALS | {404, 405}, (response.status_code, body)
        assert isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str) and body["error"].strip(), body
    return body


_NO_TOKENS = re.compile(r"invalid request: (\S+) has no tokens: ")


def _no_tokens(body: dict, message: str, tokenizer) -> bool:
    """True if ``message`` is the 422 for a text without tokens and the tokenizer agrees:
    the field it names (``texts[1]``, ``items[0].question`` ...) tokenizes to nothing."""
    match = _NO_TOKENS.match(message)
    if match is None:
        return False
    value = body
    for part in match.group(1).split("."):
        name, _, index = part.partition("[")
        value = value[name] if not index else value[name][int(index.rstrip("]"))]
    assert tokenizer.encode(value, add_special_tokens=False).input_ids == [], (message, value)
    return True


def _fuzz(schema, examples=EXAMPLES, only=None, shrink=True, tokenizer=None, **call):
    """Fuzz every operation (or those labelled in ``only``) in each mode of ``examples``;
    returns ``{(operation, mode): Counter(status)}``, where a positive-mode 422 for a text
    without tokens (checked with ``tokenizer``) counts as ``"no tokens"``. Raises at the
    first failed check, with the smallest failing request hypothesis finds (when ``shrink``)."""
    seen = {}
    phases = tuple(Phase) if shrink else (Phase.explicit, Phase.generate)
    for result in schema.get_all_operations():
        operation = result.ok()
        if only is not None and operation.label not in only:
            continue
        for mode, n in examples.items():
            if mode == NEGATIVE and not list(operation.body):
                continue  # GET /health takes nothing that could be wrong
            seen[operation.label, mode] = _fuzz_operation(operation, mode, settings(max_examples=n, phases=phases, **SETTINGS),
                                                          call, tokenizer)
    return seen


def _fuzz_operation(operation, mode, hypothesis_settings, call, tokenizer=None) -> collections.Counter:
    statuses = collections.Counter()
    checks = CHECKS + ([negative_data_rejection] if mode == NEGATIVE else [])

    @hypothesis_settings
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case):
        response = case.call(**call)
        body = _assert_answer(response)
        no_tokens = mode == POSITIVE and response.status_code == 422 and tokenizer is not None and \
            _no_tokens(case.body, body["error"], tokenizer)
        statuses["no tokens" if no_tokens else response.status_code] += 1
        case.validate_response(response, checks=checks)

    run()
    return statuses


def test_schema_declares_bodies_limits_and_errors(served):
    kind, _, schema = served
    raw = schema.raw_schema
    assert raw["openapi"].startswith("3.1")
    assert {(m.upper(), path) for path, item in raw["paths"].items() for m in item} == {
        ("GET", "/health"), ("POST", f"/{kind}"), ("POST", "/embed")}
    for path in (f"/{kind}", "/embed"):
        op = raw["paths"][path]["post"]
        assert op["requestBody"]["required"] is True
        assert set(op["responses"]) == {"200", "400", "408", "413", "415", "422", "429", "431", "503"}
        for code in ("400", "408", "413", "415", "422", "429", "431", "503"):
            assert op["responses"][code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
        assert op["responses"]["429"]["headers"]["Retry-After"]["schema"] == {"type": "integer", "minimum": 1}
    error = raw["components"]["schemas"]["ErrorBody"]
    assert error["required"] == ["error"] and error["properties"]["error"] == {"type": "string", "minLength": 1, "title": "Error"}
    bodies = json.dumps({k: v for k, v in raw["components"]["schemas"].items() if k != "ErrorBody"})
    assert f'"maxLength": {MAX_TEXT_CHARS}' in bodies and f'"maxItems": {MAX_ITEMS}' in bodies and '"minItems": 1' in bodies
    assert '"additionalProperties": true' not in bodies and '"additionalProperties": false' in bodies
    # "Not blank" in the schema is exactly what the server's str.strip() leaves non-empty.
    not_blank = re.compile(NOT_BLANK)
    assert all((not_blank.search(chr(c)) is None) == chr(c).isspace() for c in range(0x3001))
    assert not any(chr(c).isspace() for c in range(0x3001, 0x110000))


def test_schemathesis_finds_no_server_error_and_refuses_malformed_bodies(served, encoder):
    kind, _, schema = served
    # /embed is the same code on the same encoder in every run: fuzzed once, with /classify.
    operations = {"GET /health", f"POST /{kind}"} | ({"POST /embed"} if kind == "classify" else set())
    seen = _fuzz(schema, only=operations, tokenizer=encoder[1])
    print("\n" + "\n".join(f"{kind} {label} {mode.value}: {dict(sorted(s.items(), key=str))}" for (label, mode), s in seen.items()))
    assert {label for label, _ in seen} == operations
    for (label, mode), statuses in seen.items():
        total = sum(statuses.values())
        if label == "GET /health":  # no parameters: one distinct request
            assert statuses == {200: total} and total >= 1
            continue
        # Every operation ran, in both modes (hypothesis may stop early on duplicates).
        assert total >= 0.8 * EXAMPLES[mode], (label, mode, statuses)
        if mode == POSITIVE and label == "POST /classify":
            # 'pairs' of another length than 'texts': a refusal JSON Schema cannot express.
            assert statuses[200] >= 0.5 * total and set(statuses) <= {200, 422, "no tokens"}, (label, statuses)
        elif mode == POSITIVE:
            # The schema is no stricter than the server: all answered, but texts without tokens.
            assert statuses[200] >= 0.5 * total and set(statuses) <= {200, "no tokens"}, (label, statuses)
        else:
            assert sum(statuses[s] for s in REFUSALS) >= 0.9 * total, (label, statuses)
            assert len(set(statuses) & REFUSALS) >= 2, (label, statuses)  # more than one kind of wrong


# Bodies no schema describes, POSTed as application/json to /embed (every run serves it).
_ODDITIES = [
    (b"", 422, "the request body is empty"),
    (b"null", 422, "must be a JSON object, not null"),
    (b"[1, 2]", 422, "must be a JSON object, not an array"),
    (b'"text"', 422, "must be a JSON object, not a string"),
    (b"NaN", 422, "must be a JSON object, not a number"),
    (b'{"text": NaN}', 422, "text: Input should be a valid string"),
    (b'{"texts": ["a", -Infinity]}', 422, "texts[1]: Input should be a valid string"),
    (b'{"text": 1e999}', 422, "text: Input should be a valid string"),
    (b'{"text": ' + b"9" * 5000 + b"}", 400, "a number has too many digits"),
    (b"[" * 20_000 + b"]" * 20_000, 400, "nested too deeply"),
    (b'{"text": {"text": {"text": "a"}}}', 422, "text: Input should be a valid string"),
    (b'{"texts": [["a"]]}', 422, "texts[0]: Input should be a valid string"),
    (b'{"text": "a", "text": 5}', 422, "text: Input should be a valid string"),  # the last duplicate key counts
    (b'{"text": "a"}\x00', 400, "Extra data"),
    (b'{"text": "a"}{"text": "b"}', 400, "Extra data"),
    (b'{"text": "\xff"}', 400, "send UTF-8 JSON"),
    (b'{"text": "\\ud83d"}', 422, "unpaired surrogate"),
    (b'{"text": "\\u001c\\u3000"}', 422, "empty or only whitespace"),
    (b'{"text": "a", "pair": "b"}', 422, "takes no 'pair'"),
    (b'{"texts": [], "text": null}', 422, "the list is empty"),
    (b'{"texts": ["a", "b", "c", "d", "e"]}', 413, f"limit is {MAX_ITEMS} (--max-items)"),
    (b'{"text": "' + b"x" * (MAX_TEXT_CHARS + 1) + b'"}', 413, f"limit is {MAX_TEXT_CHARS} (--max-text-chars)"),
    (b"\xef\xbb\xbf" + b'{"text": "a"}', 200, None),  # a UTF-8 byte-order mark is skipped
    ('{"text": "caf\u00e9"}'.encode("utf-16"), 200, None),  # json.loads reads UTF-16 and -32 too
    (b'{"text": "\\u0000"}', 422, "text has no tokens"),  # not blank, but the tokenizer drops it
    (b'{"texts": ["a", "\\u200b\\u200b"]}', 422, "texts[1] has no tokens"),
    (b'{"text": "\\u0301"}', 422, "text has no tokens"),  # a combining mark without a base
    (b'{"text": "a\\u0000\\u0301"}', 200, None),
    (b'{"text": "a", "pair": null, "texts": null, "pairs": null}', 200, None),  # null: not given
]


@pytest.mark.parametrize("served", ["classify"], indirect=True)  # /embed is the same in every run
@pytest.mark.parametrize("body, status, words", _ODDITIES, ids=range(len(_ODDITIES)))
def test_json_oddities_get_a_4xx_with_a_message(served, body, status, words):
    _, app, _ = served
    with schemathesis_asgi.get_client(app) as client:
        response = client.post("/embed", data=body, headers={"content-type": "application/json"})
    answer = _assert_answer(response)
    assert response.status_code == status, answer
    assert words is None or words in answer["error"], answer


_JSON_KEYS = ["text", "texts", "pair", "pairs", "question", "context", "items", "x"]
_CONTENT_TYPES = [None, "application/json", "application/json; charset=latin-1", "application/problem+json", "text/plain",
                  "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "application/octet-stream"]
_JSON_VALUES = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=8),
                            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(_JSON_KEYS), inner, max_size=3),
                            max_leaves=8)


def test_random_bytes_json_and_content_types_get_a_4xx_with_a_message(served):
    kind, app, _ = served
    statuses = collections.Counter()
    with schemathesis_asgi.get_client(app) as client:

        @settings(max_examples=100, **SETTINGS)
        @given(path=st.sampled_from([f"/{kind}", f"/{kind}", "/embed", "/health", "/nope"]),
               method=st.sampled_from(["POST", "POST", "POST", "GET", "PUT"]),
               body=st.binary(max_size=40) | _JSON_VALUES.map(lambda v: json.dumps(v).encode()),
               content_type=st.sampled_from(_CONTENT_TYPES))
        def run(path, method, body, content_type):
            response = client.request(method, path, data=body, headers={} if content_type is None else {"content-type": content_type})
            statuses[response.status_code] += 1
            _assert_answer(response)

        run()
    assert sum(statuses.values()) >= 80 and {404, 405, 415, 422} <= set(statuses), statuses


class _Broken:
    """The served app with a handler deliberately broken, to show the fuzzer notices.

    ``crash``: a list of two or more texts answers 500. ``mute``: a 422 loses its message.
    The lifespan goes through to the wrapped app (its batchers start and stop).
    """

    def __init__(self, app, how: str):
        self.app, self.how = app, how

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]
        try:
            texts = json.loads(replay[0]["body"]).get("texts")
        except (ValueError, AttributeError):
            texts = None
        if self.how == "crash" and isinstance(texts, list) and len(texts) >= 2:
            from starlette.responses import JSONResponse

            return await JSONResponse({"error": "internal error (KeyError); see the server log"}, status_code=500)(scope, receive, send)
        status = [0]

        async def send_muted(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
                if status[0] == 422:
                    message = {**message, "headers": [(k, b"0" if k == b"content-length" else v) for k, v in message["headers"]]}
            elif message["type"] == "http.response.body" and status[0] == 422:
                message = {**message, "body": b""}
            await send(message)

        async def replayed():
            return replay.pop() if replay else await receive()

        return await self.app(scope, replayed, send_muted if self.how == "mute" else send)


@pytest.mark.parametrize("served", ["classify"], indirect=True)
@pytest.mark.parametrize("how, mode, caught", [("crash", POSITIVE, "(500, "), ("mute", NEGATIVE, "empty body with status 422")])
def test_the_fuzzer_catches_a_broken_handler(served, how, mode, caught):
    _, app, schema = served
    schemathesis_asgi.shutdown_lifespans()  # the app starts again, behind the broken wrapper
    with pytest.raises(AssertionError, match=re.escape(caught)):
        _fuzz(schema, {mode: EXAMPLES[mode]}, only={"POST /classify"}, shrink=False, app=_Broken(app, how))
