"""ASAx decision-tree experts and the exponential-weights learner that mixes them.

The light modules (features, tree, store, default, weights, loss, records, show) need only numpy;
experts.fit additionally needs scikit-learn and imports it only when fitting.
"""
