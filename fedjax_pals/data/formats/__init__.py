"""Readers of the federated file formats users hold, each a registered data set read from
config.dataset.data_dir (docs/guide/natural_data.md): LEAF's JSON directories (``leaf``),
TensorFlow Federated's SQLite client data (``tff_sqlite``), FedJAX's SQLite client data
(``fedjax_sqlite``) and Parquet / Hugging Face tables with a client-id column (``parquet``)."""

from fedjax_pals.data.formats import fedjax_sqlite, leaf, parquet, tff_sqlite  # noqa: F401
