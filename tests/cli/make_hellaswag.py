"""Writes a small HellaSwag-format jsonl for the tests: make_hellaswag.py OUT N WORDS_FILE.

Questions built from the words of WORDS_FILE (so the test tokenizer knows
them): contexts from 3 to 30 words (some longer than a test sequence, which
then loses its start), endings of 1 to 5 words (so acc_norm's division
matters), non-ASCII text (bytes != characters, a lower-case first letter for
lm-eval's capitalize), WikiHow's brackets (lm-eval's preprocess), one
question with 3 endings, one label written as a string, the other fields
HellaSwag has.
"""
import json
import random
import sys

out, n, words_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = random.Random(11)
words = open(words_file, encoding="utf-8").read().replace(":", "").replace(".", "").split()
with open(out, "w", encoding="utf-8") as f:
    for i in range(n):
        ctx_a = " ".join(r.choice(words) for _ in range(r.randint(3, 30))).capitalize() + "."
        # HellaSwag's ctx_b: the start of the sentence the ending completes,
        # lower case (lm-eval capitalizes it), sometimes empty.
        ctx_b = "" if i % 3 == 0 else " ".join(r.choice(words) for _ in range(r.randint(1, 3))).lower()
        if i == 4:
            ctx_b = "\u00e9lection  [header] said"  # a non-ASCII first letter; WikiHow's brackets
        if i == 6:
            ctx_b = "then [step]"  # leaves the query ending in a space (lm-eval moves it)
        k = 3 if i == 5 else 4
        ends = [" ".join(r.choice(words) for _ in range(r.randint(1, 5))) + "." for _ in range(k)]
        if i == 2:
            ends[1] = "the jury said \u00e9lection na\u00efve."
        if i == 3:
            ends[0] = " the jury [title] said [step] fair.  "  # lm-eval's preprocess at work
        label = r.randrange(k)
        ctx = (ctx_a + " " + ctx_b).strip()
        f.write(json.dumps({"ind": i, "activity_label": "test label", "ctx_a": ctx_a, "ctx_b": ctx_b,
                            "ctx": ctx, "endings": ends, "label": str(label) if i == 7 else label,
                            "split": "val"}) + "\n")
