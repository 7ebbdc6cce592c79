from fdlit.data.datasets import DATASETS, TensorDataset, load_dataset
from fdlit.data.federated import ClientData, FederatedData

__all__ = ["DATASETS", "TensorDataset", "load_dataset", "ClientData", "FederatedData"]
