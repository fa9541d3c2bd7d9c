#!/usr/bin/env bash
# MovieLens end to end, with a multi-valued field:
#   bash examples/movielens.sh TRAIN_CSV TEST_CSV OUT_DIR
# CSVs in MovieLens-1M's joined layout (DeepCTR's movielens_sample.txt: user_id, movie_id,
# rating, timestamp, title, genres, gender, age, occupation, zip), any number of rows.
# A click is a rating of 4 or more. `genres` (Comedy|Drama) is a multi_hot field, mean-pooled;
# user, movie, gender, age, occupation, zip and the hour of the timestamp are categorical.
# The test CSV is featurized with the training CSV's vocabulary. Featurizing multi-valued
# columns writes TFRecord with declared fields directly, so there is no convert step.
# The last line printed is test_auc=<value>.
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 TRAIN_CSV TEST_CSV OUT_DIR" >&2; exit 2; }
train_csv=$1 test_csv=$2 out=$3
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$root/scripts/env.sh" >/dev/null
mkdir -p "$out"

# The hour of the day as a column of its own (featurize reads columns as they are).
python - "$train_csv" "$test_csv" "$out" <<'PY'
import sys
import pandas as pd
for src, name in zip(sys.argv[1:3], ("train", "test")):
    d = pd.read_csv(src)
    d["hour"] = pd.to_datetime(d["timestamp"], unit="s").dt.hour
    d.to_csv(f"{sys.argv[3]}/{name}.csv", index=False)
PY

ctrtrain data featurize "$out/train.csv" --out "$out/train" --overwrite \
  --label-column rating --label-threshold 4 --multi-hot genres --drop title,timestamp \
  --min-count 1
ctrtrain data featurize "$out/test.csv" --out "$out/test" --overwrite \
  --vocab "$out/train/vocab.json"
ctrtrain data validate "$out/train"
ctrtrain data validate "$out/test"
ctrtrain train --train "$out/train" --test "$out/test" --model-dir "$out/model" \
  --epochs "${EPOCHS:-10}" --batch-size "${BATCH_SIZE:-64}" --predictions auto
python -c "import json, sys; print('test_auc=%.4f' % json.load(open(sys.argv[1]))['test']['auc'])" \
  "$out/model/result.json"
