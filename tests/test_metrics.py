"""LongBench and RULER metrics: every expected value below is computed by hand (arithmetic in the
comments), following the rules of LongBench/metrics.py + LongBench/eval.py and RULER's
scripts/eval/synthetic/constants.py."""

from __future__ import annotations

import pytest

from polykv.eval import metrics as M

# -------------------------------------------------------------------------------------------------
# Normalisation and English QA F1
# -------------------------------------------------------------------------------------------------


def test_normalize_answer_lowercases_strips_punctuation_and_articles():
    # lower -> "the cat's an  anna, then!" ; punctuation out -> "the cats an  anna then"
    # articles (whole words only) -> " cats    anna then" ; whitespace -> "cats anna then"
    assert M.normalize_answer("The Cat's an  Anna, then!") == "cats anna then"


def test_normalize_zh_answer_drops_cn_and_ascii_punctuation_and_all_spaces():
    # "，" "。" "“" "”" and "!" are punctuation; spaces are removed, not collapsed; "AB" -> "ab"
    assert M.normalize_zh_answer("“北京 AB”，是首都。!") == "北京ab是首都"


def test_qa_f1_partial_overlap_articles_and_punctuation_removed():
    # pred "The cat sat on a mat!" -> "cat sat on mat" (4 tokens); gt "A cat sat." -> "cat sat" (2)
    # common = 2; P = 2/4 = 0.5, R = 2/2 = 1; F1 = 2*0.5*1 / 1.5 = 2/3
    assert M.qa_f1_score("The cat sat on a mat!", "A cat sat.") == pytest.approx(2 / 3, abs=1e-12)


def test_qa_f1_counts_multiset_overlap_and_zero_when_disjoint():
    # "paris paris" vs "paris": common = min(2, 1) = 1; P = 1/2, R = 1; F1 = 1 / 1.5 = 2/3
    assert M.qa_f1_score("Paris paris", "Paris") == pytest.approx(2 / 3, abs=1e-12)
    assert M.qa_f1_score("London", "Paris") == 0.0
    # only articles/punctuation on one side -> no tokens -> no overlap -> 0
    assert M.qa_f1_score("The.", "the") == 0.0
    assert M.qa_f1_score("Paris.", "paris") == 1.0


def test_qa_f1_zh_jieba_tokens():
    # jieba: "北京是中国的首都。" -> 北京|是|中国|的|首都|。 ; "。" normalises to "" and is dropped -> 5 tokens
    #        "中国的首都" -> 中国|的|首都 (3 tokens); common = 3
    # P = 3/5, R = 3/3 = 1; F1 = 2*0.6 / 1.6 = 0.75
    assert M.qa_f1_zh_score("北京是中国的首都。", "中国的首都") == pytest.approx(0.75, abs=1e-12)
    # "今天天气很好" -> 今天天气|很|好 (3) ; "今天天气不错" -> 今天天气|不错 (2); common = 1
    # P = 1/3, R = 1/2; F1 = 2*(1/6) / (5/6) = 2/5
    assert M.qa_f1_zh_score("今天天气很好", "今天天气不错") == pytest.approx(0.4, abs=1e-12)


# -------------------------------------------------------------------------------------------------
# ROUGE-L (rouge package, summary level)
# -------------------------------------------------------------------------------------------------


def test_rouge_l_english_is_lcs_based_f():
    # ref  "the suspect was arrested by police"      m = 6 distinct words
    # pred "police arrested the suspect yesterday"   n = 5 distinct words
    # LCS(ref, pred) = "the suspect" (arrested/police appear in opposite orders) -> llcs = 2
    # R = 2/6, P = 2/5; F = 2PR / (P + R + 1e-8) = 2*(2/15) / (11/15 + 1e-8) ~= 4/11 = 0.363636...
    # (ROUGE-1 would see 4 shared unigrams, F = 2*(4/5)(4/6)/(4/5+4/6) = 8/11: this is not ROUGE-1)
    got = M.rouge_score("police arrested the suspect yesterday", "the suspect was arrested by police")
    p, r = 2 / 5, 2 / 6
    assert got == pytest.approx(2.0 * ((p * r) / (p + r + 1e-8)), abs=1e-15)
    assert got == pytest.approx(4 / 11, abs=1e-7)


def test_rouge_l_union_over_sentences_split_on_period():
    # ref r = "w1 w2 w3 w4 w5" (m = 5); pred = "w1 w2 w6 w7 w8. w1 w3 w8 w9 w5": two sentences,
    # n = distinct pred words {w1 w2 w6 w7 w8 w3 w9 w5} = 8.
    # LCS(r, c1) = w1 w2, LCS(r, c2) = w1 w3 w5; union = {w1 w2 w3 w5} -> llcs = 4
    # R = 4/5, P = 4/8; F = 2*0.4 / (1.3 + 1e-8) ~= 8/13 = 0.615384...
    got = M.rouge_score("w1 w2 w6 w7 w8. w1 w3 w8 w9 w5", "w1 w2 w3 w4 w5")
    assert got == pytest.approx(8 / 13, abs=1e-7)


def test_rouge_l_quirks_sets_epsilon_and_errors_give_zero():
    # words are sets: "the the the" vs "the" -> n = m = llcs = 1; F = 2*1 / (2 + 1e-8) = 0.999999995
    assert M.rouge_score("the the the", "the") == pytest.approx(2 / (2 + 1e-8), abs=1e-15)
    assert M.rouge_score("the the the", "the") < 1.0
    # empty prediction / only "." -> the package raises ("Hypothesis is empty.") -> 0.0
    assert M.rouge_score("", "some reference") == 0.0
    assert M.rouge_score("...", "some reference") == 0.0


def test_rouge_l_zh_on_jieba_tokens():
    # "我喜欢吃苹果" -> "我 喜欢 吃 苹果" (n = 4); "我喜欢苹果" -> "我 喜欢 苹果" (m = 3)
    # LCS = 我 喜欢 苹果 -> 3; R = 3/3 = 1, P = 3/4; F = 2*0.75 / (1.75 + 1e-8) ~= 6/7
    assert M.rouge_zh_score("我喜欢吃苹果", "我喜欢苹果") == pytest.approx(6 / 7, abs=1e-7)


# -------------------------------------------------------------------------------------------------
# Classification, retrieval, count
# -------------------------------------------------------------------------------------------------

CLASSES = ["Abbreviation", "Animal", "Animal species", "City", "Country"]


def test_classification_basic():
    # only "City" occurs in the prediction -> matched = [City] -> 1/1
    assert M.classification_score("Type: City", "City", all_classes=CLASSES) == 1.0
    # "City" and "Country" both occur, neither is a proper substring of "City"-> 1/2
    assert M.classification_score("City or Country", "City", all_classes=CLASSES) == 0.5
    # the answer class does not occur -> 0
    assert M.classification_score("Country", "City", all_classes=CLASSES) == 0.0
    # lsht (Chinese): substring match as well
    assert M.classification_score("类别：体育", "体育", all_classes=["军事", "体育", "财经"]) == 1.0


def test_classification_drops_class_contained_in_the_answer():
    # prediction "Animal species" matches "Animal" and "Animal species"; "Animal" is inside the
    # answer "Animal species" without being equal -> dropped -> matched = [Animal species] -> 1/1
    assert M.classification_score("Animal species", "Animal species", all_classes=CLASSES) == 1.0
    # but with answer "Animal", "Animal species" is not inside "Animal" -> kept -> 1/2
    assert M.classification_score("Animal species", "Animal", all_classes=CLASSES) == 0.5


def test_classification_reproduces_remove_while_iterating_quirk():
    # matched = [a, b, abc]; step 0 drops "a" (in "abc", != "abc"), the list becomes [b, abc] and
    # the next step looks at index 1 = "abc": "b" is skipped and kept -> 1/len([b, abc]) = 1/2
    assert M.classification_score("abc", "abc", all_classes=["a", "b", "abc"]) == 0.5
    # a class order without the skip drops both -> 1/1
    assert M.classification_score("abc", "abc", all_classes=["a", "abc", "b"]) == 1.0


def test_retrieval_en_and_zh():
    # digits in prediction: [3, 12]; target 3 -> 1/2
    assert M.retrieval_score("Paragraph 3, not Paragraph 12", "Paragraph 3") == 0.5
    assert M.retrieval_score("The answer is Paragraph 3.", "Paragraph 3") == 1.0
    assert M.retrieval_score("I do not know", "Paragraph 3") == 0.0
    # zh: target from "段落5"; digits [5, 15] -> 1/2 (15 is not 5: whole digit runs compare)
    assert M.retrieval_zh_score("答案是段落5和段落15", "段落5") == 0.5
    assert M.retrieval_zh_score("段落5", "段落5") == 1.0


def test_count_score():
    # digits [7, 30]; answer 7 -> 1/2 ; no digits -> 0 ; an int answer compares as str
    assert M.count_score("There are 7 unique paragraphs out of 30", "7") == 0.5
    assert M.count_score("seven", "7") == 0.0
    assert M.count_score("7", 7) == 1.0


# -------------------------------------------------------------------------------------------------
# Code similarity
# -------------------------------------------------------------------------------------------------


def test_code_sim_first_code_line_rule():
    # leading "\n" dropped; "```python" (backtick) and "# comment" (#) skipped -> "    return x + 1"
    pred = "\n\n```python\n# comment\n    return x + 1\n```"
    assert M.code_sim_score(pred, "    return x + 1") == 1.0
    # "contains", not "starts with": the line with a trailing comment is skipped too
    assert M.code_sim_score("x = 1  # set x\ny = 2", "y = 2") == 1.0
    # "//" anywhere skips the line (Java/C comments, but also URLs)
    assert M.code_sim_score("url = 'http://a'\nok()", "ok()") == 1.0
    # a blank line after the fence is a "code line": prediction becomes "" -> ratio 0
    assert M.code_sim_score("```\n\nfoo()", "foo()") == 0.0
    # nothing usable at all -> "" -> 0
    assert M.code_sim_score("# only a comment", "foo()") == 0.0


def test_code_sim_fuzzywuzzy_integer_rounding():
    # Indel ratio = (len1 + len2 - indel distance) / (len1 + len2)
    # "return a" vs "return b": 16 chars, distance 2 -> 14/16 = 87.5 -> round-half-even 88 -> 0.88
    assert M.code_sim_score("return a", "return b") == 0.88
    # "abcdefgh" vs "abcdexyz": common "abcde", distance 3+3 = 6 -> 10/16 = 62.5 -> 62 -> 0.62
    assert M.code_sim_score("abcdefgh", "abcdexyz") == 0.62
    # 2/3 * 100 = 66.67 -> 67: "abc" vs "abd": distance 2, 4/6
    assert M.code_sim_score("abc", "abd") == 0.67


def test_code_sim_difflib_backend_differs():
    # fuzzywuzzy without python-Levenshtein uses difflib: "aaa" vs "abaa": the longest block "aa"
    # (a[0:2] = b[2:4]) leaves nothing matchable on either side -> M = 2 -> 2*2/7 = 57.14 -> 57
    # Indel: LCS "aaa" = 3 -> 6/7 = 85.71 -> 86
    assert M.code_sim_score("aaa", "abaa", matcher="difflib") == 0.57
    assert M.code_sim_score("aaa", "abaa") == 0.86
    with pytest.raises(ValueError):
        M.code_sim_score("a", "b", matcher="nope")


# -------------------------------------------------------------------------------------------------
# LongBench task scorer
# -------------------------------------------------------------------------------------------------


def test_longbench_table_has_the_21_tasks():
    assert len(M.LONGBENCH_METRICS) == 21
    expected = {
        M.qa_f1_score: {
            "narrativeqa",
            "qasper",
            "multifieldqa_en",
            "hotpotqa",
            "2wikimqa",
            "musique",
            "triviaqa",
        },
        M.qa_f1_zh_score: {"multifieldqa_zh"},
        M.rouge_score: {"gov_report", "qmsum", "multi_news", "samsum"},
        M.rouge_zh_score: {"dureader", "vcsum"},
        M.classification_score: {"trec", "lsht"},
        M.retrieval_score: {"passage_retrieval_en"},
        M.retrieval_zh_score: {"passage_retrieval_zh"},
        M.count_score: {"passage_count"},
        M.code_sim_score: {"lcc", "repobench-p"},
    }
    for fn, tasks in expected.items():
        assert {t for t, f in M.LONGBENCH_METRICS.items() if f is fn} == tasks
    assert M.LONGBENCH_FIRST_LINE_TASKS == {"trec", "triviaqa", "samsum", "lsht"}


def test_longbench_max_over_ground_truths_and_scaling():
    # sample 1: "Barack Obama" vs "Obama": P = 1/2, R = 1 -> 2/3;
    #           vs "Barack Hussein Obama": P = 2/2, R = 2/3 -> 2*(2/3)/(5/3) = 0.8 -> max 0.8
    # sample 2: "Paris paris" vs "Paris" -> 2/3
    # score = round(100 * (0.8 + 2/3) / 2, 2) = round(73.333.., 2) = 73.33
    preds = ["Barack Obama", "Paris paris"]
    answers = [["Obama", "Barack Hussein Obama"], ["Paris"]]
    assert M.longbench_sample_score("hotpotqa", preds[0], answers[0]) == pytest.approx(0.8)
    assert M.longbench_score("hotpotqa", preds, answers) == 73.33


def test_longbench_first_line_cut_only_for_four_tasks():
    pred = "\nParis\nThe capital of France is Paris"
    # triviaqa: leading "\n" dropped, cut at the next "\n" -> "Paris" -> F1 1 -> 100.0
    assert M.longbench_score("triviaqa", [pred], [["Paris"]]) == 100.0
    # narrativeqa: no cut -> tokens paris capital of france is paris (6; "the" removed)
    # common with [paris] = 1: P = 1/6, R = 1 -> 2*(1/6)/(7/6) = 2/7 -> 28.571.. -> 28.57
    assert M.longbench_score("narrativeqa", [pred], [["Paris"]]) == 28.57
    # trec: "City\nCountry": cut -> "City" -> 1/1; without the cut it would be 1/2
    assert M.longbench_score("trec", ["City\nCountry"], [["City"]], all_classes=CLASSES) == 100.0
    # lsht: same rule with Chinese classes
    assert M.longbench_score("lsht", ["体育\n财经"], [["体育"]], all_classes=["体育", "财经"]) == 100.0
    # samsum: only "w1 w2 w3" is scored against "w1 w2 w3": F = 2 / (2 + 1e-8) -> 100.0 after rounding
    # (without the cut, "w4 w5" would add 2 prediction words: P = 3/5, F = 0.75 -> 75.0)
    assert M.longbench_score("samsum", ["w1 w2 w3\nw4 w5"], [["w1 w2 w3"]]) == 100.0
    assert M.longbench_score("gov_report", ["w1 w2 w3\nw4 w5"], [["w1 w2 w3"]]) == 75.0


def test_longbench_code_and_retrieval_tasks():
    # lcc: 0.88 and 0.62 -> round(100 * 1.5 / 2, 2) = 75.0
    assert M.longbench_score("lcc", ["return a", "abcdefgh"], [["return b"], ["abcdexyz"]]) == 75.0
    # passage_retrieval_zh: 1/2 and 1 and 0 -> 100 * 1.5 / 3 = 50.0
    preds = ["段落5和段落15", "段落2", "不知道"]
    assert M.longbench_score("passage_retrieval_zh", preds, [["段落5"], ["段落2"], ["段落1"]]) == 50.0


def test_longbench_rejects_bad_input():
    with pytest.raises(ValueError):
        M.longbench_score("not_a_task", ["x"], [["x"]])
    with pytest.raises(ValueError):
        M.longbench_score("hotpotqa", ["x", "y"], [["x"]])
    with pytest.raises(ValueError):
        M.longbench_score("hotpotqa", [], [])
    with pytest.raises(TypeError):
        M.longbench_score("hotpotqa", ["x"], ["x"])


# -------------------------------------------------------------------------------------------------
# RULER
# -------------------------------------------------------------------------------------------------


def test_ruler_string_match_all():
    # sample 1: refs 123, 456 found, 999 not -> 2/3 ; sample 2: "ABC" found in "value: abc" -> 1
    # score = round((2/3 + 1) / 2 * 100, 2) = round(83.333.., 2) = 83.33
    preds = ["The numbers are 123 and 456.", "Value: abc"]
    refs = [["123", "456", "999"], ["ABC"]]
    assert M.ruler_string_match_all(preds, refs) == 83.33


def test_ruler_string_match_part():
    # sample 1: "Paris" found -> 1 ; sample 2: "Berlin" not found -> 0 ; sample 3: second ref -> 1
    # score = round(2 / 3 * 100, 2) = 66.67 ; the same data under "all": 1/2 + 0 + 1/2 -> 33.33
    preds = ["Answer: paris", "london", "It is in FRANCE"]
    refs = [["Paris", "France"], ["Berlin"], ["Lyon", "france"]]
    assert M.ruler_string_match_part(preds, refs) == 66.67
    assert M.ruler_string_match_all(preds, refs) == 33.33


def test_ruler_task_table_and_score():
    assert M.RULER_METRICS == {
        "niah": M.ruler_string_match_all,
        "variable_tracking": M.ruler_string_match_all,
        "common_words_extraction": M.ruler_string_match_all,
        "freq_words_extraction": M.ruler_string_match_all,
        "qa": M.ruler_string_match_part,
    }
    assert len(M.RULER_TASKS) == 13
    for task in ("niah_single_1", "niah_multivalue", "vt", "cwe", "fwe", "niah_custom"):
        assert M.ruler_metric(task) is M.ruler_string_match_all
    for task in ("qa_1", "qa_2", "qa"):
        assert M.ruler_metric(task) is M.ruler_string_match_part
    with pytest.raises(ValueError):
        M.ruler_metric("unknown")
    # postprocess: strip, control characters -> "\n"
    assert M.ruler_postprocess_pred("  12\t34\x00 ") == "12\n34"
    # vt with 2 refs, 1 found -> 50.0 ; qa_1 with 2 refs, 1 found -> 100.0
    assert M.ruler_score("vt", [" VAR X1 "], [["x1", "x2"]]) == 50.0
    assert M.ruler_score("qa_1", [" VAR X1 "], [["x1", "x2"]]) == 100.0
    with pytest.raises(ValueError):
        M.ruler_string_match_all(["a"], [["a"], ["b"]])
    with pytest.raises(TypeError):
        M.ruler_string_match_part(["a"], ["a"])
