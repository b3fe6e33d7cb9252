"""Readers of the federated file formats users hold, each a registered data set read from
config.dataset.data_dir (see docs/guide/natural_data.md)."""
