#!/usr/bin/env python3
"""More evaluation sets for the recall model without PyTorch.

../shared/models/recall/make_recall.py `evalset --seed S` writes held-out conversations, but the
script imports torch at module level (for training) although making conversations needs only the
standard library. This runs the data half of make_recall.py (everything before its model section)
and writes the same rows as its `evalset` command: one JSON object per line with `turns` (chat
messages up to and including the question), `question_turn`, `fact_turn`, `answer`, `slot`.

  /usr/bin/python3 scripts/recall_evalset.py --seed 1 --n 300 --out /tmp/eval_s1.jsonl

With --seed 12345 (make_recall's default) it reproduces eval.jsonl byte for byte.
"""
import argparse, json, os, random, sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = os.path.join(HERE, '..', '..', 'shared', 'models', 'recall', 'make_recall.py')
MARKER = '# ----------------------------------------------------------------------------- model'


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--src', default=DEFAULT_SRC, help='make_recall.py')
    ap.add_argument('--seed', type=int, default=12345)
    ap.add_argument('--n', type=int, default=300)
    ap.add_argument('--out', required=True)
    a = ap.parse_args()
    text = open(a.src).read()
    cut = text.find(MARKER)
    if cut < 0:
        sys.exit('error: %s has no model-section marker; cannot separate the data half' % a.src)
    # The data half imports gguf (for its tokenizer class, unused here): give it a harmless stub.
    ns = {'__name__': 'make_recall_data', '__file__': a.src}
    sys.modules.setdefault('gguf', type(sys)('gguf'))
    exec(compile(text[:cut], a.src, 'exec'), ns)
    rng = random.Random(a.seed)  # as make_recall.eval_convs
    with open(a.out, 'w') as fh:
        for _ in range(a.n):
            cv = ns['make_conv'](rng, intermediate_q=True)
            q = cv['question_turn']
            turns = [{'role': r, 'content': t} for r, t in cv['turns'][:q + 1]]
            fh.write(json.dumps(dict(turns=turns, question_turn=q, fact_turn=cv['fact_turn'],
                                     answer=cv['answer'], slot=cv['slot'])) + '\n')


if __name__ == '__main__':
    main()
