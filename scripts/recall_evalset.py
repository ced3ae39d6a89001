#!/usr/bin/env python3
"""More evaluation sets for the recall model without PyTorch.

../shared/models/recall/make_recall.py `evalset --seed S` writes held-out conversations, but the
script imports torch at module level (for training) although making conversations needs only the
standard library. This runs the data half of make_recall.py (everything before its model section)
and writes the same rows as its `evalset` command: one JSON object per line with `turns` (chat
messages up to and including the question), `question_turn`, `fact_turn`, `answer`, `slot`.

  /usr/bin/python3 scripts/recall_evalset.py --seed 1 --n 300 --out /tmp/eval_s1.jsonl

With --seed 12345 (make_recall's default) it reproduces eval.jsonl byte for byte.

--fact-distance changes one thing only: where the fact's exchange sits. make_recall places it just
before the question with probability 0.2 and otherwise uniformly among the earlier exchanges
(`uniform`, the default, unchanged). `geometric:P` draws its distance d in exchanges before the
question (d = 1: the exchange just before it) with P(d = k) proportional to P (1 - P)^(k - 1),
truncated to the conversation's 1 .. n_user - 1 exchanges (one rng.random() draw, inverse CDF):
references that decay with distance, as in real dialogue. Everything else (turn count, slot,
values, distractors, intermediate questions, the rng stream's use) is make_recall's code.
"""
import argparse, json, os, random, sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_SRC = os.path.join(HERE, '..', '..', 'shared', 'models', 'recall', 'make_recall.py')
MARKER = '# ----------------------------------------------------------------------------- model'
# make_recall's one line that places the fact (its user-turn index fu in 0 .. n_user - 2; the
# question is user turn n_user - 1).
FACT_LINE = 'fu = n_user - 2 if rng.random() < 0.2 else rng.randint(0, n_user - 3)  # user turn with the fact'


def parse_distance(spec):
    """'uniform' -> None; 'geometric:P' with 0 < P < 1 -> P. Anything else: exit with a message."""
    if spec == 'uniform':
        return None
    kind, _, arg = spec.partition(':')
    try:
        p = float(arg)
    except ValueError:
        p = -1.0
    if kind != 'geometric' or not 0 < p < 1:
        sys.exit('error: --fact-distance takes uniform or geometric:P with 0 < P < 1, got %r' % spec)
    return p


def geometric_fact_turn(p):
    """fu for a fact at distance d = n_user - 1 - fu, P(d = k) ~ p (1 - p)^(k - 1), k in 1 .. n_user - 1."""
    def fact_turn(rng, n_user):
        d_max = n_user - 1
        w = [(1 - p) ** (k - 1) for k in range(1, d_max + 1)]
        u = rng.random() * sum(w)
        d = d_max
        for k, wk in enumerate(w, start=1):
            if u < wk:
                d = k
                break
            u -= wk
        return n_user - 1 - d
    return fact_turn


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--src', default=DEFAULT_SRC, help='make_recall.py')
    ap.add_argument('--seed', type=int, default=12345)
    ap.add_argument('--n', type=int, default=300)
    ap.add_argument('--out', required=True)
    ap.add_argument('--fact-distance', default='uniform',
                    help="uniform (make_recall's placement) or geometric:P (see the head comment)")
    a = ap.parse_args()
    p = parse_distance(a.fact_distance)
    text = open(a.src).read()
    cut = text.find(MARKER)
    if cut < 0:
        sys.exit('error: %s has no model-section marker; cannot separate the data half' % a.src)
    data = text[:cut]
    if p is not None:
        if data.count(FACT_LINE) != 1:
            sys.exit('error: %s does not place the fact with the line this script replaces' % a.src)
        data = data.replace(FACT_LINE, 'fu = _fact_user_turn(rng, n_user)')
    # The data half imports gguf (for its tokenizer class, unused here): give it a harmless stub.
    ns = {'__name__': 'make_recall_data', '__file__': a.src}
    if p is not None:
        ns['_fact_user_turn'] = geometric_fact_turn(p)
    sys.modules.setdefault('gguf', type(sys)('gguf'))
    exec(compile(data, a.src, 'exec'), ns)
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
