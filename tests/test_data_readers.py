"""Data readers: exact counts on the real benchmark files, and every kind of bad input."""

import json
import logging
import zipfile
from collections import Counter

import pytest

from ctxkit.data import (
    GLUE_TASKS,
    DataError,
    TaggedSentence,
    align_labels,
    encode_tagged,
    get_glue_task,
    iob1_to_bio,
    label_list,
    read_conll,
    read_glue,
    read_squad,
    read_table,
    split_by_article,
    summarize,
    word_predictions,
)


def write(path, text, encoding="utf-8"):
    path.write_text(text, encoding=encoding)
    return path


def summary_lines(caplog):
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    return [m for m in messages if m.startswith("read ")]


# ----------------------------------------------------------------------------- GLUE, real files

GLUE_COUNTS = [
    ("SST-2", "train", 67349), ("SST-2", "dev", 872), ("SST-2", "test", 1821),
    ("CoLA", "train", 8551), ("CoLA", "dev", 1043), ("CoLA", "test", 1063),
    ("MRPC", "train", 3668), ("MRPC", "dev", 408), ("MRPC", "test", 1725),
    ("STS-B", "train", 5749), ("STS-B", "dev", 1500), ("STS-B", "test", 1379),
    ("QNLI", "dev", 5463), ("QNLI", "test", 5463),
    ("RTE", "train", 2490), ("RTE", "dev", 277), ("RTE", "test", 3000),
    ("WNLI", "train", 635), ("WNLI", "dev", 71), ("WNLI", "test", 146),
]


@pytest.mark.parametrize("task,split,count", GLUE_COUNTS)
def test_glue_real_counts(shared_data, task, split, count):
    res = read_glue(task, shared_data / "glue", split)
    assert len(res) == count and not res.skipped
    spec = GLUE_TASKS[task]
    assert all(e.text.strip() for e in res)
    assert all((e.text_pair is None) == (spec.pair_column is None) for e in res)
    if split == "test":
        assert all(e.label is None for e in res)
    elif spec.is_regression:
        assert all(isinstance(e.label, float) and 0.0 <= e.label <= 5.0 for e in res)
    else:
        assert {e.label for e in res} == set(range(spec.num_labels))


def test_glue_real_label_balance(shared_data):
    glue = shared_data / "glue"
    assert Counter(e.label for e in read_glue("MRPC", glue / "MRPC", "dev")) == {1: 279, 0: 129}
    assert Counter(e.label for e in read_glue("sst2", glue, "dev")) == {0: 428, 1: 444}
    qnli = read_glue("QNLI", glue, "dev")
    assert Counter(qnli.labels[e.label] for e in qnli) == {"entailment": 2702, "not_entailment": 2761}
    rte = read_glue("rte", glue / "RTE" / "dev.tsv", "dev")  # a file path works too
    assert Counter(rte.labels[e.label] for e in rte) == {"entailment": 146, "not_entailment": 131}
    stsb = read_glue("STS-B", glue, "dev")
    assert stsb.is_regression and stsb.labels is None and stsb[0].label == 5.0
    # CoLA has no header: its first line is an example, and its guid is line 1.
    cola = read_glue("CoLA", glue, "dev")
    assert cola[0].guid == "dev.tsv:1" and cola[0].text == "The sailors rode the breeze clear of the rocks."


def test_glue_registry():
    assert set(GLUE_TASKS) == {"SST-2", "CoLA", "MRPC", "STS-B", "QQP", "MNLI", "QNLI", "RTE", "WNLI"}
    assert get_glue_task("stsb") is GLUE_TASKS["STS-B"] and get_glue_task("Sst_2") is GLUE_TASKS["SST-2"]
    assert GLUE_TASKS["STS-B"].num_labels == 1 and GLUE_TASKS["STS-B"].metrics == ("pearson", "spearman")
    assert GLUE_TASKS["CoLA"].metrics == ("mcc",) and GLUE_TASKS["MRPC"].metrics == ("f1", "accuracy")
    assert GLUE_TASKS["MNLI"].labels == ("contradiction", "entailment", "neutral")
    assert GLUE_TASKS["MNLI"].dev_splits == ("dev_matched", "dev_mismatched")
    assert GLUE_TASKS["QNLI"].labels == GLUE_TASKS["RTE"].labels == ("entailment", "not_entailment")
    with pytest.raises(KeyError, match="known: SST-2"):
        get_glue_task("glue-x")


# ----------------------------------------------------------------------------- GLUE, synthetic

MNLI_HEAD = ("index promptID pairID genre sentence1_binary_parse sentence2_binary_parse sentence1_parse "
             "sentence2_parse sentence1 sentence2").split()


def mnli_row(i, s1, s2, *labels):
    return "\t".join([str(i), "1", "1a", "fiction", "(bp1)", "(bp2)", "(p1)", "(p2)", s1, s2, *labels])


def test_mnli_and_qqp_synthetic(tmp_path):
    mnli = tmp_path / "MNLI"
    mnli.mkdir()
    dev_head = "\t".join(MNLI_HEAD + ["label1", "label2", "label3", "label4", "label5", "gold_label"])
    write(mnli / "dev_matched.tsv", "\n".join([
        dev_head,
        mnli_row(0, 'He said "hi.', "He spoke.", "entailment", "entailment", "neutral", "entailment", "entailment",
                 "entailment"),
        mnli_row(1, "A cat.", "No cat.", "contradiction", "contradiction", "contradiction", "neutral", "neutral",
                 "contradiction"),
    ]) + "\n")
    write(mnli / "train.tsv", "\n".join(["\t".join(MNLI_HEAD + ["label1", "gold_label"]),
                                         mnli_row(0, "x y", "z", "neutral", "neutral")]) + "\n")
    write(mnli / "test_mismatched.tsv", "\n".join(["\t".join(MNLI_HEAD), mnli_row(0, "a", "b")]) + "\n")
    dev = read_glue("MNLI", tmp_path, "dev_matched")  # the GLUE root also works
    assert [(e.text, e.text_pair, dev.labels[e.label]) for e in dev] == [
        ('He said "hi.', "He spoke.", "entailment"), ("A cat.", "No cat.", "contradiction")]
    assert read_glue("MNLI", mnli, "train")[0].label == 2
    assert read_glue("MNLI", mnli, "test_mismatched")[0].label is None
    with pytest.raises(ValueError, match="dev_matched"):
        read_glue("MNLI", mnli, "dev")

    qqp = write(tmp_path / "qqp.tsv", "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
                                      "7\t1\t2\tHow do I cook?\tHow to cook?\t1\n"
                                      "8\t3\t4\tWhy is the sky blue?\tWhat is rice?\t0\n")
    res = read_glue("QQP", qqp, "train")
    assert [(e.text_pair, e.label, e.guid) for e in res] == [("How to cook?", 1, "qqp.tsv:2"),
                                                             ("What is rice?", 0, "qqp.tsv:3")]
    test = write(tmp_path / "qqp_test.tsv", "id\tquestion1\tquestion2\n0\tA?\tB?\n")
    assert read_glue("QQP", test, "test")[0].text_pair == "B?"


def test_glue_wrong_column_count(tmp_path, caplog):
    bad = write(tmp_path / "dev.tsv", "sentence\tlabel\ngood one \t1\nno label here\nfine \t0\nx\ty\tz\n")
    with pytest.raises(DataError, match=r"dev\.tsv:3: wrong column count: expected 2 .* found 1") as info:
        read_glue("SST-2", bad, "dev")
    assert str(info.value).startswith(f"{bad}:3: ") and info.value.where == 3
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        res = read_glue("SST-2", bad, "dev", on_error="skip")
    assert [e.guid for e in res] == ["dev.tsv:2", "dev.tsv:4"]
    assert res.skipped == Counter({"wrong column count": 2})
    assert any(m.startswith(f"{bad}:5: wrong column count") for m in caplog.messages)
    assert summary_lines(caplog) == [f"read 2 examples from {bad}; skipped 2 (wrong column count: 2)"]
    assert res.summary == summary_lines(caplog)[0]


def test_glue_label_and_text_problems(tmp_path, caplog):
    rte = write(tmp_path / "rte.tsv", "index\tsentence1\tsentence2\tlabel\n0\tA.\tB.\tentailment\n"
                                      "1\tA.\tB.\tcontradiction\n2\t \tB.\tentailment\n")
    with pytest.raises(DataError, match=r"rte\.tsv:3: unknown label: 'contradiction'; allowed: entailment, "
                                        r"not_entailment"):
        read_glue("RTE", rte, "dev")
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        res = read_glue("RTE", rte, "dev", on_error="skip")
    assert len(res) == 1 and res.skipped == Counter({"unknown label": 1, "empty text": 1})
    assert summary_lines(caplog) == [f"read 1 examples from {rte}; skipped 2 (unknown label: 1, empty text: 1)"]

    head = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore\n"
    row = "0\tmain\tMSRvid\t2012\t0001\tnone\tnone\tA man.\tA person.\t{}\n"
    stsb = write(tmp_path / "stsb.tsv", head + row.format("3.8") + row.format("high") + row.format("5.2"))
    with pytest.raises(DataError, match=r"stsb\.tsv:3: non-numeric score: 'high'"):
        read_glue("STS-B", stsb, "train")
    res = read_glue("STS-B", stsb, "train", on_error="skip")
    assert [e.label for e in res] == [3.8]
    assert res.skipped == Counter({"non-numeric score": 1, "score out of range": 1})

    missing = write(tmp_path / "sst.tsv", "text\tlabel\nx\t1\n")
    with pytest.raises(DataError, match=r"sst\.tsv:1: missing column: no text column 'sentence'"):
        read_glue("SST-2", missing, "dev", on_error="skip")  # a bad header cannot be skipped
    with pytest.raises(ValueError, match="on_error"):
        read_glue("SST-2", missing, "dev", on_error="ignore")


def test_summarize():
    assert summarize("X", 8551, Counter({"wrong column count": 2, "unknown label": 1})) == \
        "read 8551 examples from X; skipped 3 (wrong column count: 2, unknown label: 1)"
    assert summarize("X", 5, Counter()) == "read 5 examples from X; skipped 0"


# ----------------------------------------------------------------------------- user tables

def test_read_table_csv_tsv_jsonl(tmp_path):
    csv_file = write(tmp_path / "pairs.csv", 'text,text_pair,label\n"Hello, world",hi,pos\n'
                                             '"two\nlines",b,neg\nplain,"say ""x""",pos\n')
    res = read_table(csv_file)
    assert res.labels == ["neg", "pos"] and not res.is_regression
    assert [(e.text, e.text_pair, e.label, e.guid) for e in res] == [
        ("Hello, world", "hi", 1, "pairs.csv:2"), ("two\nlines", "b", 0, "pairs.csv:3"),
        ("plain", 'say "x"', 1, "pairs.csv:5")]

    tsv = write(tmp_path / "single.tsv", 'text\tlabel\nhe said "no\t2\nok\t10\nyes\t2\n')
    res = read_table(tsv)
    assert res.labels == ["2", "10"]  # integer labels sort numerically
    assert [(e.text, e.text_pair, e.label) for e in res] == [
        ('he said "no', None, 0), ("ok", None, 1), ("yes", None, 0)]

    unlabelled = write(tmp_path / "plain.jsonl", '{"text": "a"}\n\n{"text": "b", "other": 1}\n')
    res = read_table(unlabelled)
    assert [(e.text, e.label) for e in res] == [("a", None), ("b", None)] and res.labels is None

    reg = write(tmp_path / "reg.jsonl", '{"text": "a", "text_pair": "b", "label": 0.5}\n'
                                        '{"text": "c", "text_pair": "d", "label": 4}\n')
    res = read_table(reg)
    assert res.is_regression and res.labels is None and [e.label for e in res] == [0.5, 4.0]
    assert read_table(reg, regression=False).labels == ["0.5", "4"]

    given = write(tmp_path / "given.csv", "sentence,y\nfine,good\nbad,awful\n")
    with pytest.raises(DataError, match=r"given\.csv:3: unknown label: 'awful'; allowed: bad, good"):
        read_table(given, text_column="sentence", label_column="y", labels=["bad", "good"])
    with pytest.raises(DataError, match=r"given\.csv:1: missing column"):
        read_table(given)


def test_read_table_bad_rows(tmp_path, caplog):
    broken = write(tmp_path / "broken.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "label": \n'
                                              '{"label": "y"}\n["list"]\n{"text": "c", "label": "y"}\n')
    with pytest.raises(DataError, match=r"broken\.jsonl:2: invalid JSON: Expecting value at column 24"):
        read_table(broken)
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        res = read_table(broken, on_error="skip")
    assert [(e.text, e.label) for e in res] == [("a", 0), ("c", 1)]
    assert res.skipped == Counter({"invalid JSON": 1, "missing field": 1, "not a JSON object": 1})
    assert summary_lines(caplog) == [res.summary] and "skipped 3" in res.summary

    ragged = write(tmp_path / "ragged.csv", "text,label\na,1\nb\n,1\nc,\n")
    with pytest.raises(DataError, match=r"ragged\.csv:3: wrong column count"):
        read_table(ragged)
    res = read_table(ragged, on_error="skip")
    assert [e.text for e in res] == ["a"]
    assert res.skipped == Counter({"wrong column count": 1, "empty text": 1, "empty label": 1})
    with pytest.raises(DataError, match=r"empty\.tsv:1: missing header"):
        read_table(write(tmp_path / "empty.tsv", ""))
    with pytest.raises(DataError, match=r"dev\.tsv:1: missing header"):
        read_glue("RTE", write(tmp_path / "dev.tsv", ""), "dev")
    with pytest.raises(ValueError, match="unsupported table format"):
        read_table(tmp_path / "data.parquet")


# ----------------------------------------------------------------------------- CoNLL, real files

@pytest.fixture(scope="module")
def conll_valid(shared_data):
    return read_conll(shared_data / "conll2003" / "valid.txt")


@pytest.mark.parametrize("name,sentences,documents,tokens", [
    ("train.txt", 14041, 946, 203621), ("valid.txt", 3250, 216, 51362), ("test.txt", 3453, 231, 46435)])
def test_conll_real_counts(shared_data, name, sentences, documents, tokens):
    res = read_conll(shared_data / "conll2003" / name)
    assert len(res) == sentences and res.num_documents == documents and not res.skipped
    assert len({s.doc_index for s in res}) == documents and res[-1].doc_index == documents - 1
    assert sum(len(s.words) for s in res) == tokens
    assert res.source_scheme == "bio"  # the shared copy is already IOB2
    assert {t[2:] for s in res for t in s.tags if t != "O"} == {"PER", "ORG", "LOC", "MISC"}
    assert label_list(res) == ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from ctxkit.tokenizers import WordPieceTokenizer

    return WordPieceTokenizer.from_dir(minilm_dir)


@pytest.mark.parametrize("max_length", [512, 24])
def test_conll_subword_round_trip(conll_valid, tokenizer, max_length, caplog):
    label_to_id = {t: i for i, t in enumerate(label_list(conll_valid))}
    truncated_words = truncated_sentences = 0
    with caplog.at_level(logging.ERROR, logger="ctxkit"):  # the tokenizer warns on every cut
        for sent in conll_valid:
            enc = encode_tagged(tokenizer, sent, label_to_id, max_length)
            assert len(enc["input_ids"]) == len(enc["labels"]) == len(enc["word_index"]) <= max_length
            back = word_predictions(enc["word_index"], enc["labels"], num_words=len(sent.words))
            gold = [label_to_id[t] for t in sent.tags]
            kept = len(sent.words) - enc["num_truncated_words"]
            assert back[:kept] == gold[:kept] and back[kept:] == [None] * enc["num_truncated_words"]
            assert enc["num_untokenized_words"] == 0
            truncated_words += enc["num_truncated_words"]
            truncated_sentences += enc["num_truncated_words"] > 0
    if max_length == 512:
        assert truncated_words == 0
    else:  # counted, never silent: measured on valid.txt with the MiniLM vocabulary
        assert (truncated_sentences, truncated_words) == (1105, 13221)


def test_encode_tagged_maps_punctuation_split_words(tokenizer):
    sent = TaggedSentence(["U.S.", "officials", "met", "in", "Washington", "."],
                          ["B-LOC", "O", "O", "O", "B-LOC", "O"], 0, "x:1")
    label_to_id = {"O": 0, "B-LOC": 1, "I-LOC": 2}
    enc = encode_tagged(tokenizer, sent, label_to_id, 64)
    # BertPreTokenizer makes "U.S." four pre-tokens; all four belong to word 0.
    assert enc["word_index"] == [None, 0, 0, 0, 0, 1, 2, 3, 4, 5, None]
    assert enc["labels"] == [-100, 1, -100, -100, -100, 0, 0, 0, 1, 0, -100]
    cut = encode_tagged(tokenizer, sent, label_to_id, 5)
    assert cut["num_truncated_words"] == 5 and cut["word_index"] == [None, 0, 0, 0, None]
    with pytest.raises(ValueError, match="B-PER"):
        encode_tagged(tokenizer, TaggedSentence(["Bob"], ["B-PER"], 0, "y:1"), label_to_id, 16)


def test_align_and_collapse():
    word_ids = [None, 0, 0, 1, 2, 2, 2, None]
    assert align_labels(word_ids, [5, 6, 7]) == [-100, 5, -100, 6, 7, -100, -100, -100]
    assert align_labels(word_ids, [5, 6, 7], ignore_index=-1)[2] == -1
    assert word_predictions(word_ids, [9, 5, 1, 6, 7, 2, 2, 9]) == [5, 6, 7]
    assert word_predictions([None, 0, 1, None], [0, 3, 4, 0], num_words=4, fill=-1) == [3, 4, -1, -1]


# ----------------------------------------------------------------------------- CoNLL, synthetic

def test_iob1_to_bio():
    assert iob1_to_bio(["I-PER", "I-PER", "B-PER"]) == ["B-PER", "I-PER", "B-PER"]
    assert iob1_to_bio(["O", "I-LOC"]) == ["O", "B-LOC"]
    assert iob1_to_bio(["I-ORG", "I-LOC", "I-LOC", "O", "I-MISC"]) == ["B-ORG", "B-LOC", "I-LOC", "O", "B-MISC"]
    bio = ["B-PER", "I-PER", "B-PER", "O", "B-LOC"]
    assert iob1_to_bio(bio) == bio  # BIO input is left alone


def test_conll_structure_and_iob1(tmp_path):
    text = ("-DOCSTART- -X- -X- O\n\nEU NNP B-NP I-ORG\nrejects VBZ B-VP O\n\n\n"
            "Peter NNP B-NP I-PER\nBlackburn NNP I-NP I-PER\n\n-DOCSTART- -X- -X- O\n\n"
            "Germany NNP B-NP I-LOC\nFrance NNP I-NP B-LOC")  # no final newline or blank line
    f = write(tmp_path / "iob1.txt", text)
    res = read_conll(f)
    assert res.source_scheme == "iob1" and res.num_documents == 2
    assert [(s.words, s.tags, s.doc_index, s.guid) for s in res] == [
        (["EU", "rejects"], ["B-ORG", "O"], 0, "iob1.txt:3"),
        (["Peter", "Blackburn"], ["B-PER", "I-PER"], 0, "iob1.txt:7"),
        (["Germany", "France"], ["B-LOC", "B-LOC"], 1, "iob1.txt:12")]
    assert [s.tags for s in read_conll(f, scheme="iob1")] == [s.tags for s in res]
    with pytest.raises(DataError, match=r"iob1\.txt:3: entity opened by I-: 'I-ORG'"):
        read_conll(f, scheme="bio")
    chunks = read_conll(f, tag_column=2, scheme="bio")
    assert chunks[0].tags == ["B-NP", "B-VP"]
    with pytest.raises(ValueError, match="scheme"):
        read_conll(f, scheme="iob2")


def test_conll_bad_lines(tmp_path, caplog):
    f = write(tmp_path / "bad.txt", "A DT O\nB NN B-PER\n\nC NN\nD NN O\n\nE NN I-XX\nF NN B_LOC\n\nG NN O\n")
    with pytest.raises(DataError, match=r"bad\.txt:4: wrong column count: expected 3 columns like line 1, found 2"):
        read_conll(f)
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        res = read_conll(f, on_error="skip")
    assert [s.words for s in res] == [["A", "B"], ["G"]]
    assert res.skipped == Counter({"wrong column count": 1, "bad tag": 1})
    assert any(m.startswith(f"{f}:8: bad tag: 'B_LOC'") for m in caplog.messages)
    assert summary_lines(caplog) == [f"read 2 sentences from {f}; skipped 2 (wrong column count: 1, bad tag: 1)"]
    tag_only = write(tmp_path / "tag.txt", "Paris X-LOC\n")
    with pytest.raises(DataError, match=r"tag\.txt:1: bad tag: 'X-LOC'; tags must be O, B-TYPE or I-TYPE"):
        read_conll(tag_only)


# ----------------------------------------------------------------------------- SQuAD, real files

@pytest.fixture(scope="module")
def squad_v1(shared_data):
    return read_squad(shared_data / "squad_v1.1" / "dev-v1.1.json.zip", on_error="skip")


def test_squad_v1_real(squad_v1):
    assert len(squad_v1) == 10570 and len({e.title for e in squad_v1}) == 48
    assert sum(len(e.answers) for e in squad_v1) == 34726
    assert squad_v1.skipped == Counter()  # every answer of the official file is at its offset
    assert not any(e.is_impossible for e in squad_v1)
    assert all(e.context[a.start:a.end] == a.text for e in squad_v1 for a in e.answers)


def test_squad_v2_real(shared_data):
    res = read_squad(shared_data / "squad_v2.0_cs224n" / "dev-v2.0.json", on_error="skip")
    assert len(res) == 6078 and len({e.title for e in res}) == 16 and res.skipped == Counter()
    assert sum(e.is_impossible for e in res) == 3168
    assert sum(bool(e.answers) for e in res) == 2910
    assert all(bool(e.answers) != e.is_impossible for e in res)
    train, dev = split_by_article(res, dev_fraction=0.25, seed=None)  # the project's protocol
    assert (len(train), len(dev), sum(e.is_impossible for e in dev)) == (4449, 1629, 826)


def test_split_by_article(squad_v1):
    train, dev = split_by_article(squad_v1, dev_fraction=0.2, seed=0)
    train_titles, dev_titles = {e.title for e in train}, {e.title for e in dev}
    assert not train_titles & dev_titles and len(dev_titles) == 10
    assert train_titles | dev_titles == {e.title for e in squad_v1} and len(train) + len(dev) == len(squad_v1)
    again = split_by_article(squad_v1, dev_fraction=0.2, seed=0)
    assert [e.qid for e in again[1]] == [e.qid for e in dev]
    assert {e.title for e in split_by_article(squad_v1, 0.2, seed=1)[1]} != dev_titles
    train, dev = split_by_article(squad_v1, dev_fraction=10 / 48, seed=None)
    assert (len(train), len(dev)) == (8582, 1988)
    assert dev[0].title == "Intergovernmental_Panel_on_Climate_Change" and dev[-1].title == "Force"


# ----------------------------------------------------------------------------- SQuAD, synthetic

def squad_doc(answers, impossible=None):
    qa = {"id": "q1", "question": "Where?", "answers": answers}
    if impossible is not None:
        qa["is_impossible"] = impossible
    other = {"id": "q2", "question": "Who?", "answers": [{"text": "Ann", "answer_start": 0}]}
    return {"version": "1.1", "data": [{"title": "T", "paragraphs": [
        {"context": "Ann lives in Paris.", "qas": [other, qa]}]}]}


def test_squad_answer_offsets(tmp_path, caplog):
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(squad_doc([{"text": "Paris", "answer_start": 12}, {"text": "Paris", "answer_start": 13}])))
    with pytest.raises(DataError) as info:
        read_squad(f)
    msg = str(info.value)
    assert msg.startswith(f"{f}:article 0 / paragraph 0 / question q1: answer not at its offset")
    assert "'Paris' at answer_start 12" in msg and "the context there is ' Pari'" in msg
    with caplog.at_level(logging.WARNING, logger="ctxkit"):
        res = read_squad(f, on_error="skip")
    assert [(e.qid, [(a.text, a.start) for a in e.answers]) for e in res] == [("q2", [("Ann", 0)]),
                                                                              ("q1", [("Paris", 13)])]
    assert res.skipped == Counter({"answer not at its offset": 1})
    assert summary_lines(caplog) == [f"read 2 questions from {f}; skipped 1 (answer not at its offset: 1)"]

    f.write_text(json.dumps(squad_doc([{"text": "Lyon", "answer_start": 13}])))
    res = read_squad(f, on_error="skip")
    assert [e.qid for e in res] == ["q2"]
    assert res.skipped == Counter({"answer not at its offset": 1, "question without a valid answer": 1})


def test_squad_v2_zip_and_fields(tmp_path):
    doc = squad_doc([], impossible=True)
    archive = tmp_path / "v2.json.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("inner/v2.json", json.dumps(doc))
    res = read_squad(archive)
    assert [(e.qid, e.is_impossible, e.answers) for e in res][1] == ("q1", True, [])

    f = tmp_path / "fields.json"
    del doc["data"][0]["paragraphs"][0]["qas"][0]["question"]
    f.write_text(json.dumps(doc))
    with pytest.raises(DataError, match=r"article 0 / paragraph 0 / question q2: missing field: 'question'"):
        read_squad(f)
    assert [e.qid for e in read_squad(f, on_error="skip")] == ["q1"]

    f.write_text('{"data": [\n  {"title": "T",\n   "paragraphs": [}\n]}')
    with pytest.raises(DataError, match=rf"^{f}:3: invalid JSON: .* at column 19$"):
        read_squad(f, on_error="skip")  # a broken document cannot be skipped


# ----------------------------------------------------------------------------- short errors

BIG = "x" * 20_000_000  # a 20 MB line without newlines


@pytest.mark.parametrize("case", ["glue header", "table label", "conll tag", "squad answer"])
def test_a_20_mb_line_gives_a_short_error_line(tmp_path, case):
    # Issue 44 item 7: the line (or field) was quoted whole, so the error line was 20 MB long.
    if case == "glue header":  # the whole file is one line: its header
        path, line, read = write(tmp_path / "dev.tsv", BIG), 1, lambda p: read_glue("sst-2", p, "dev")
    elif case == "table label":
        path, line = write(tmp_path / "t.tsv", f"text\tlabel\nfine\tpos\nbad\t{BIG}\n"), 3
        read = lambda p: read_table(p, labels=["pos", "neg"])  # noqa: E731
    elif case == "conll tag":
        path, line, read = write(tmp_path / "ner.txt", f"EU B-ORG\nrejects {BIG}\n"), 2, read_conll
    else:
        doc = {"data": [{"title": "T", "paragraphs": [{"context": "Paris is in France.", "qas": [
            {"id": "q1", "question": "Where?", "answers": [{"text": BIG, "answer_start": 0}]}]}]}]}
        path, line, read = write(tmp_path / "squad.json", json.dumps(doc)), "article 0 / paragraph 0 / question q1", read_squad
    with pytest.raises(DataError) as err:
        read(path)
    msg = str(err.value)
    assert msg.startswith(f"{path}:{line}: ") and "\n" not in msg
    assert len(msg) < 300, msg
    assert "(20,000,000 characters)" in msg  # says how much was left out


def test_quote_and_capped_lists():
    from ctxkit.core.errors import capped_join, capped_list, quote

    assert quote("it's") == '"it\'s"' and quote(3) == "3" and quote([1, 2]) == "[1, 2]"
    long = quote("\x00" * 10_000)  # escapes are 4 characters each: the slice is cut after rendering
    assert len(long) < 240 and long.endswith("...' (10,000 characters)")
    assert capped_list([]) == "" and capped_list(["a", "b"]) == "\n  a\n  b"
    lines = capped_list(range(500)).splitlines()
    assert lines[1:] == [f"  {i}" for i in range(20)] + ["  ... and 480 more"]
    assert capped_join(range(25)) == ", ".join(map(str, range(20))) + ", ... and 5 more"
