# No weight decay on normalisation layers, biases, position embeddings, PolaFormer's learned
# `power`/`scale` and Swin's relative position bias tables.
no_decay_keys = {
    'norm': dict(decay_mult=0.0),
    'pos_embed': dict(decay_mult=0.0),
    'positional_encoding': dict(decay_mult=0.0),
    'relative_position_bias_table': dict(decay_mult=0.0),
    '.power': dict(decay_mult=0.0),
    '.scale': dict(decay_mult=0.0),
}
