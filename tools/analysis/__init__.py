"""Analysis of the linear attentions: attention rows, entropies, q–k distance statistics."""
from .attention_stats import (AttentionRecord, LayerStatistics, attention_streams, kernel_scales,
                              laplacian_inputs, layer_statistics, negative_mass, one_block_per_stage,
                              pairwise_distances, polarity_attention_rows, polarity_inputs,
                              query_subset, record_attentions, row_entropy, softmax_rows, token_index)

__all__ = [
    'AttentionRecord', 'LayerStatistics', 'attention_streams', 'kernel_scales',
    'laplacian_inputs', 'layer_statistics', 'negative_mass', 'one_block_per_stage',
    'pairwise_distances', 'polarity_attention_rows', 'polarity_inputs', 'query_subset', 'record_attentions',
    'row_entropy', 'softmax_rows', 'token_index'
]
