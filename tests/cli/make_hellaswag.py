"""Writes a small HellaSwag-format jsonl for the tests: make_hellaswag.py OUT N WORDS_FILE.

Questions built from the words of WORDS_FILE (so the test tokenizer knows
them): contexts from 3 to 30 words (some longer than a test sequence, which
then loses its start), endings of 1 to 5 words (so acc_norm's division by
bytes matters), one non-ASCII ending (bytes != characters), one question with
3 endings, one label written as a string, the other fields HellaSwag has.
"""
import json
import random
import sys

out, n, words_file = sys.argv[1], int(sys.argv[2]), sys.argv[3]
r = random.Random(11)
words = open(words_file, encoding="utf-8").read().replace(":", "").replace(".", "").split()
with open(out, "w", encoding="utf-8") as f:
    for i in range(n):
        ctx = " ".join(r.choice(words) for _ in range(r.randint(3, 30))).capitalize()
        k = 3 if i == 5 else 4
        ends = [" ".join(r.choice(words) for _ in range(r.randint(1, 5))) + "." for _ in range(k)]
        if i == 2:
            ends[1] = "the jury said \u00e9lection na\u00efve."
        label = r.randrange(k)
        f.write(json.dumps({"ind": i, "activity_label": "test", "ctx_a": ctx, "ctx_b": "", "ctx": ctx,
                            "endings": ends, "label": str(label) if i == 7 else label,
                            "split": "val"}) + "\n")
