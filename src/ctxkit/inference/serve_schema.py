"""The OpenAPI schema of ``ctxkit serve``: request, answer and error bodies.

The request bodies are validated by the pydantic models in :func:`ctxkit.inference.serve.create_app`
(strict types, no extra fields) and then by hand (limits, blank texts, texts without a
token), which gives the messages and status codes of docs/serving.md. The schemas here
describe what both accept, limits included, so that a client (or a fuzzer) generating from
/openapi.json sends bodies the server takes, and every body they reject is one the schema
rejects too. Two rules are stated in descriptions only: 'pairs' as long as 'texts', and a
text must keep a token through the run's tokenizer. Which characters a tokenizer drops
follows its own Unicode tables (BERT's uncased one: 139,270 code points, private use,
combining marks, control and format characters), a set that no pattern states usefully.
``null`` for an optional field means "not given", as the server reads it.
"""

from typing import List, Optional

__all__ = ["NOT_BLANK", "ERRORS", "ERROR_HEADERS", "EMBED_SCHEMA", "HEALTH_SCHEMA", "QA_EXAMPLES", "TEXT_EXAMPLES", "text_request_schema",
           "qa_request_schema",
           "answer_schema"]

_NULL = {"type": "null", "description": "the same as leaving the field out"}
# "Not blank": a character outside Python's whitespace (str.isspace, which str.strip and
# the server use), spelled out because regex engines disagree on \s (ECMA's lacks
# \x1c-\x1f and \x85, and adds \ufeff). tests/test_serve_fuzz.py checks the set.
NOT_BLANK = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


def _text_schema(max_text_chars: int, what: str) -> dict:
    return {"type": "string", "minLength": 1, "maxLength": max_text_chars, "pattern": NOT_BLANK,
            "description": f"{what}: not blank, at most {max_text_chars} characters (--max-text-chars; longer: 413), "
                           "with at least one character the tokenizer keeps (a text of only control, format or "
                           "zero-width characters or combining marks: 422)"}


def _list_schema(items: dict, max_items: int, what: str) -> dict:
    return {"type": "array", "items": items, "minItems": 1, "maxItems": max_items,
            "description": f"{what}: 1 to {max_items} items (--max-items; more: 413)"}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}], "description": schema.get("description", "")}


# Request bodies shown in /docs and /redoc (and sent by a schema fuzzer's explicit phase): short
# enough for any --max-text-chars a test sets (48), at most two items.
TEXT_EXAMPLES = {
    "classify": [{"text": "a gripping, beautifully acted film"}, {"texts": ["a gripping film", "dull and far too long"]},
                 {"texts": ["A man is playing a guitar.", "A dog runs."], "pairs": ["Someone plays music.", "A cat sleeps."]}],
    "ner": [{"text": "Angela Merkel visited Paris in May."}, {"texts": ["Apple opened a store in Berlin.", "Ada lives in Rome."]}],
    "embed": [{"text": "The river bank was flooded."}, {"texts": ["The bank approved my loan.", "We sat on the river bank."]}],
}
QA_EXAMPLES = [{"question": "Who won the game?", "context": "The Broncos won the game 24-10."},
               {"items": [{"question": "Where is the Louvre?", "context": "The Louvre is a museum in Paris."},
                          {"question": "Who wrote Hamlet?", "context": "Hamlet is a play by Shakespeare."}]}]


def text_request_schema(endpoint: str, max_items: int, max_text_chars: int) -> dict:
    """``{"text": ...}`` or ``{"texts": [...]}`` (with ``pair``/``pairs`` for /classify)."""
    text = _text_schema(max_text_chars, "the text")
    texts = _list_schema(_text_schema(max_text_chars, "a text"), max_items, "the texts")
    one = {"text": text, "texts": _NULL}
    many = {"texts": texts, "text": _NULL}
    if endpoint == "classify":
        pair = _text_schema(max_text_chars, "the second text of a sentence pair")
        pairs = _list_schema(_text_schema(max_text_chars, "a second text"), max_items,
                             "second texts of sentence pairs, as many as 'texts' (otherwise: 422)")
        one.update(pair=_nullable(pair), pairs=_NULL)
        many.update(pairs=_nullable(pairs), pair=_NULL)
    else:
        one.update(pair=_NULL, pairs=_NULL)
        many.update(pair=_NULL, pairs=_NULL)
    body = {"type": "object", "additionalProperties": False}
    return {"title": f"{endpoint.capitalize()}Request",
            "description": "one text, or a list of texts" + (" (with sentence pairs)" if endpoint == "classify" else ""),
            "examples": TEXT_EXAMPLES[endpoint],
            "oneOf": [{**body, "title": "one text", "required": ["text"], "properties": one},
                      {**body, "title": "a list of texts", "required": ["texts"], "properties": many}]}


def qa_request_schema(max_items: int, max_text_chars: int) -> dict:
    question, context = _text_schema(max_text_chars, "the question"), _text_schema(max_text_chars, "the passage to answer from")
    item = {"type": "object", "additionalProperties": False, "required": ["question", "context"],
            "properties": {"question": question, "context": context}}
    body = {"type": "object", "additionalProperties": False}
    return {"title": "QARequest", "description": "one question and its context, or a list of them", "examples": QA_EXAMPLES,
            "oneOf": [{**body, "title": "one question", "required": ["question", "context"],
                       "properties": {"question": question, "context": context, "items": _NULL}},
                      {**body, "title": "a list of questions", "required": ["items"],
                       "properties": {"items": _list_schema(item, max_items, "the questions"), "question": _NULL, "context": _NULL}}]}


def answer_schema(kind: str, labels: Optional[List[str]], regression: bool) -> dict:
    """The 200 answer of the task endpoint: ``{"prediction": P}`` or ``{"predictions": [P, ...]}``."""
    if kind == "classify" and regression:
        one = {"type": "object", "required": ["score"], "additionalProperties": False,
               "properties": {"score": {"type": ["number", "null"], "description": "null: not a finite number"}}}
    elif kind == "classify":
        one = {"type": "object", "required": ["label", "probs"], "additionalProperties": False,
               "properties": {"label": {"type": "string", **({"enum": list(labels)} if labels else {})},
                              "probs": {"type": "object", "additionalProperties": {"type": "number", "minimum": 0, "maximum": 1},
                                        **({"required": list(labels), "propertyNames": {"enum": list(labels)}} if labels else {})}}}
    elif kind == "ner":
        entity = {"type": "object", "required": ["type", "start", "end", "text"], "additionalProperties": False,
                  "properties": {"type": {"type": "string"}, "start": {"type": "integer", "minimum": 0},
                                 "end": {"type": "integer", "minimum": 0}, "text": {"type": "string"}}}
        one = {"type": "object", "required": ["text", "entities"], "additionalProperties": False,
               "properties": {"text": {"type": "string"}, "entities": {"type": "array", "items": entity}}}
    else:
        span = {"type": ["integer", "null"], "minimum": 0, "description": "null: no valid span"}
        one = {"type": "object", "required": ["question", "answer", "score", "start", "end"], "additionalProperties": False,
               "properties": {"question": {"type": "string"}, "answer": {"type": "string"},
                              "score": {"type": ["number", "null"], "description": "null: no valid span"},
                              "start": span, "end": span}}
    return _one_or_many(one, "prediction")


def _one_or_many(one: dict, key: str, extra: Optional[dict] = None) -> dict:
    extra = extra or {}
    required = sorted(extra)
    return {"oneOf": [{"type": "object", "required": [key, *required], "additionalProperties": False,
                       "properties": {key: one, **extra}},
                      {"type": "object", "required": [key + "s", *required], "additionalProperties": False,
                       "properties": {key + "s": {"type": "array", "items": one}, **extra}}]}


EMBED_SCHEMA = _one_or_many({"type": "array", "items": {"type": "number"}, "minItems": 1}, "embedding",
                             {"dim": {"type": "integer", "minimum": 1, "description": "the length of each vector"}})

HEALTH_SCHEMA = {"type": "object", "required": ["status", "task", "kind", "endpoints", "limits", "stats"],
                  "properties": {"status": {"const": "ok"}, "task": {"type": "string"},
                                 "kind": {"enum": ["classify", "ner", "qa"]},
                                 "labels": {"type": ["array", "null"], "items": {"type": "string"}},
                                 "run": {"type": ["string", "null"],
                                         "description": "the run folder's name, or its Hub id (a path only with --expose-paths)"},
                                 "model": {"type": ["string", "null"], "description": "the model's name or Hub id"},
                                 "connections": {"type": ["object", "null"],
                                                 "description": "the HTTP front's limits (--max-connections, timeouts, "
                                                                "--max-header-bytes) and counters"},
                                 "endpoints": {"type": "array", "items": {"type": "string"}},
                                 "batching": {"type": "object"}, "limits": {"type": "object"},
                                 "threads": {"type": "object", "required": ["torch", "source", "cores"],
                                             "properties": {"torch": {"type": "integer", "minimum": 1},
                                                            "source": {"enum": ["--threads", "OMP_NUM_THREADS", "auto"]},
                                                            "cores": {"type": "integer", "minimum": 1}}},
                                 "uptime_s": {"type": "number"}, "stats": {"type": "object"}}}

# What each error status means; the body is always ``{"error": "<message>"}`` (ErrorBody).
ERRORS = {400: "malformed JSON: not JSON, not UTF-8, nested too deeply, or a number of over 4300 digits",
           408: "the request's headers (--header-timeout) or body (--body-timeout) did not arrive in time",
           413: "too many items (--max-items), a text too long (--max-text-chars), a body too large (--max-body-bytes), "
                "or (/embed) texts that need more windows of the model's length than --max-windows",
           415: "the body is not sent as 'Content-Type: application/json'",
           422: "valid JSON but not a valid request: wrong type, missing, conflicting or unknown field, blank text, "
                "a text the tokenizer reduces to no tokens, empty list",
           429: "the endpoint's queue is full (--max-queue): retry after the Retry-After header's seconds",
           431: "the request line and headers are too large (--max-header-bytes)",
           503: "the server is shutting down, or every connection is busy (--max-connections)"}
# Headers an error answer carries (OpenAPI response objects' "headers").
ERROR_HEADERS = {429: {"headers": {"Retry-After": {"description": "seconds the queue needs to drain (estimated from recent batches)",
                                                   "schema": {"type": "integer", "minimum": 1}}}}}
