"""What every model shares: its configuration, the embedding table, the output bias, and the
contract with training (train/step.py), export and the optimizer.

A model is a short file: a subclass of `CTRModel` that builds its blocks (blocks.py) in
`build` and returns its logit's terms from the embedded fields in `terms`; the table, its
sparse-aware updates, every distribution mode, checkpoints and export come with the base.
"""

from __future__ import annotations

import dataclasses

import tensorflow as tf

from .blocks import MLP, NumericLinear
from .engine.dynamic import dynamic_ids
from .engine.tables import EMBEDDING_INIT, EmbeddingTable, shards


@dataclasses.dataclass
class ModelConfig:
    feature_size: int
    field_size: int
    embedding_size: int = 16
    deep_layers: tuple[int, ...] = (256, 128, 64)
    dropout: float | tuple[float, ...] = 0.0   # drop *rate* of the deep layers' outputs (or
                                               # one per layer)
    batch_norm: bool = False
    l2_dense: float = 0.0         # l2_dense * tf.nn.l2_loss(kernel) per dense kernel (the
                                  # table's L2 is its optimizer's: engine/updates.py)
    embedding_init: float | None = None  # the embeddings' initial standard deviation (None:
                                         # the model's, CTRModel.embedding_init)
    mixed_precision: bool = False # bfloat16 MLP (and CIN) compute, float32 master weights
    xla: bool = False             # XLA-compile the MLP (the sparse part has dynamic shapes)
    seed: int = 0
    initial_bias: float = 0.0     # the output bias at the start: logit of the positive rate
    numeric_fields: int = 0       # declared numeric fields
    numeric_input: str = "embedding"   # how they enter the model: "embedding", a row of the
                                       # table each (feature_size + j) times the value, in
                                       # every block; "value", the value itself into the deep
                                       # part's input (and a weight times it into the linear
                                       # part), as DeepCTR's DenseFeat: no row, no slot;
                                       # "both", the row times the value in every block and
                                       # the value itself into the deep part's input too
    bags: tuple[tuple[int, str], ...] = ()   # (max_len, pooling) of each multi_hot or
                                             # sequence field, in field order
    fields: tuple[tuple[str, str], ...] = ()   # declared fields' (name, kind), in declaration
                                               # order; () for the fixed schema
    dynamic: tuple[tuple[int, int, int], ...] = ()   # (ids column, first row, rows) of each
                                                     # dynamic field (data/schema.py
                                                     # dynamic_pools): its ids are raw keys
    dynamic_admit: int = 1        # times a key is seen before it claims a row
    dynamic_ttl: int = 0          # steps unseen after which a row is given back first
    model: str = "deepfm"         # the model's name (models/__init__.py MODELS)
    options: dict = dataclasses.field(default_factory=dict)   # the model's own options

    @property
    def dynamic_columns(self) -> tuple[int, ...]:
        """The `ids` columns that hold dynamic fields' raw keys."""
        return tuple(c for c, _, _ in self.dynamic)

    @property
    def numeric_slotless(self) -> int:
        """The numeric fields without a row or a slot in the embedded block (numeric_input
        value)."""
        return self.numeric_fields if self.numeric_input == "value" else 0

    @property
    def numeric_appended(self) -> int:
        """The numeric values appended to the deep part's input (numeric_input value, both)."""
        return self.numeric_fields if self.numeric_input in ("value", "both") else 0

    @property
    def slots(self) -> int:
        """The embedded block's slots (fields that have one)."""
        return self.field_size - self.numeric_slotless

    def rates(self) -> tuple[float, ...]:
        d = self.dropout
        return tuple(d) if isinstance(d, (tuple, list)) else (float(d),) * len(self.deep_layers)


class CTRModel(tf.Module):
    """logit = bias + the sum of the model's terms. Subclasses set `first_order` (the table
    holds a linear weight per id in column 0), `embeds` (it has embeddings: False makes the
    table one column wide), and define `build` and `terms`."""
    first_order = True
    embeds = True
    # The embeddings start normal around 0 with this standard deviation unless the run says
    # (ModelConfig.embedding_init): the field's model zoos' 1e-4 (DeepCTR's SparseFeat,
    # FuxiCTR's FeatureEmbedding). ctrtrain's earlier 0.01 let xDeepFM's validation pick
    # earlier, weaker epochs on MovieLens-100K (docs/quality.md, "The embeddings' initial
    # scale"). A model whose embeddings meet only each other (FM) overrides it.
    embedding_init = EMBEDDING_INIT
    unique_gradients = EmbeddingTable.unique_gradients

    def __init__(self, cfg: ModelConfig, name: str | None = None):
        """Create inside a strategy's scope to distribute the variables (the table may become
        a ShardedVariable under parameter servers)."""
        super().__init__(name=name)
        from . import MODELS
        self.cfg = cfg
        # The model's own options (ModelConfig.options), their defaults where not given.
        self.options = {**{n: o.default for n, o in MODELS[cfg.model].options.items()},
                        **cfg.options}
        if not self.embeds:
            cfg = dataclasses.replace(cfg, embedding_size=0)
        if cfg.embedding_init is None:
            cfg = dataclasses.replace(cfg, embedding_init=self.embedding_init)
        self.embeddings = EmbeddingTable(cfg, self.first_order)
        # Dynamic fields: one map of their raw keys onto their buckets (a pool each).
        self.dynamic = dynamic_ids([(base, rows) for _, base, rows in cfg.dynamic],
                                   admit=cfg.dynamic_admit, ttl=cfg.dynamic_ttl) \
            if cfg.dynamic else None
        # Starting at the data's base rate, early steps are calibrated on rare-positive data
        # instead of spending themselves on moving the bias from 0.5.
        self.bias = tf.Variable(float(cfg.initial_bias), name="bias")
        self.blocks = self.build(cfg)
        # Numeric values without rows in a model with a linear part: a weight times each value
        # there, as the table's column 0 is for ids (DeepCTR's linear part over its DenseFeat).
        # With rows (numeric_input both) their column 0 is that weight.
        self.numeric_linear = None
        if cfg.numeric_slotless and self.first_order:
            self.numeric_linear = NumericLinear(cfg.numeric_slotless)
            self.blocks.append(self.numeric_linear)

    def build(self, cfg: ModelConfig) -> list:
        """Creates the model's blocks (after the table, so that seeded initial values do not
        depend on the model) and returns them."""
        return []

    def terms(self, embedded, training: bool) -> list:
        """The logit's terms [B] (added to the bias in this order)."""
        raise NotImplementedError

    @property
    def table(self):
        return self.embeddings.table

    @property
    def embedding_tables(self):
        """The table's variables: itself, or its shards when partitioned."""
        return self.embeddings.variables_to_update

    def dense_variables(self):
        own = [v for b in self.blocks for v in b.variables_to_update()]
        return [v for var in [self.bias] + own for v in shards(var)]

    def gradient_terms(self) -> list:
        """[(dense variable, row mask [rows, 1] or None, l2)]: what the optimizer adds to their
        gradients in their update (engine/updates.py Optimizer.build's `terms`), where the
        step leaves it out: the gradient of the L2 penalty __call__ returns (l2_dense), and
        the first-order column's rows an MLP's first kernel holds at zero (blocks.MLP
        input_mask: those rows start at zero and, their gradient masked, stay there, so the
        forward pass multiplies by no mask either). A sharded kernel (parameter servers):
        each shard with its rows of the mask."""
        l2 = self.cfg.l2_dense or 0.0
        terms = {id(k): [k, None, l2] for b in self.blocks for k in b.penalized()} if l2 else {}
        for b in self.blocks:
            if isinstance(b, MLP) and b.input_mask is not None:
                terms.setdefault(id(b.kernels[0]), [b.kernels[0], None, 0.0])[1] = b.input_mask
        out = []
        for var, mask, l2 in terms.values():
            start = 0
            for shard in shards(var):
                rows = shard.shape[0]
                out.append((shard, None if mask is None else mask[start:start + rows], l2))
                start += rows
        return out

    def _keys(self, features):
        """The dynamic fields' columns of the batch's ids [B, dynamic fields]."""
        return tf.gather(features["ids"], list(self.cfg.dynamic_columns), axis=1)

    def claim_rows(self, features, step, share=None):
        """Training, before the forward pass: the dynamic fields' keys in the batch counted
        and new ones given rows (DynamicIds.assign). Returns (the batch with table rows in
        place of keys, for __call__'s `keys_mapped`; the rows claimed [n], whose vectors and
        optimizer state the caller renews: train/step.py). `share(keys, assign)` -> (this
        replica's rows, the rows claimed): how replicas assign the whole step's keys in one
        order (train/runtime.py Runtime.assign_keys); None: this batch alone."""
        def assign(keys):
            return self.dynamic.assign(keys, step)
        keys = self._keys(features)
        rows, claimed = share(keys, assign) if share is not None else assign(keys)
        return self._with_rows(features, rows), claimed

    def table_ids(self, features):
        """The batch with its dynamic fields' keys replaced by their rows (read only: a key
        without a row reads its pool's shared row)."""
        if self.dynamic is None:
            return features
        return self._with_rows(features, self.dynamic.lookup(self._keys(features)))

    def _with_rows(self, features, rows):
        """The batch's ids with the dynamic fields' columns replaced by `rows` [B, dynamic]:
        one concat and one gather of static columns (a column at a time cost two ops each)."""
        ids = features["ids"]
        width, dynamic = ids.shape[1], self.cfg.dynamic_columns
        if dynamic == tuple(range(width)):
            return {**features, "ids": rows}
        columns = list(range(width))
        for j, c in enumerate(dynamic):
            columns[c] = width + j
        return {**features, "ids": tf.gather(tf.concat([ids, rows], 1), columns, axis=1)}

    def __call__(self, features, training: bool = False, read_rows=None,
                 keys_mapped: bool = False):
        """Returns (logits [B], the dense kernels' L2 penalty) of a batch's features (ids,
        values; with declared fields also numeric, bag_ids, bag_weights: data/schema.py).
        `keys_mapped`: the dynamic fields' keys are already rows (claim_rows)."""
        logits = self.bias
        embedded = self.embeddings(features if keys_mapped else self.table_ids(features),
                                   read_rows)
        for term in self.terms(embedded, training):
            logits = logits + term
        if self.numeric_linear is not None:
            logits = logits + self.numeric_linear(embedded.numeric)
        penalized = [k for b in self.blocks for k in b.penalized()]
        l2 = 0.0
        if self.cfg.l2_dense and penalized:
            l2 = self.cfg.l2_dense * tf.add_n([tf.nn.l2_loss(k) for k in penalized])
        return logits, l2
