"""What a dataset's labels and stored inputs are, for what fdlit writes about a trained network
(the model card of ``fdlit export``): class names in label order, and the preprocessing fdlit
applies when it loads the data (before any input step of the network)."""

from __future__ import annotations

CIFAR100 = (  # noqa: SIM905 (a hundred names read better as text)
    "apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus butterfly camel can "
    "castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur dolphin "
    "elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster "
    "man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck "
    "pine_tree plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk "
    "skyscraper snail snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger "
    "tractor train trout tulip turtle wardrobe whale willow_tree wolf woman worm").split()
# label order of each source: Fashion-MNIST (Xiao et al. 2017), CIFAR (Krizhevsky 2009), Yahoo Answers
# Topics (Zhang et al. 2015, the Hugging Face dataset's topic labels)
CLASS_NAMES: dict[str, list[str]] = {
    "digits": [str(i) for i in range(10)],
    "mnist": [str(i) for i in range(10)],
    "fashion_mnist": ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                      "Ankle boot"],
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
    "cifar100": CIFAR100,
    "yahoo_answers": ["Society & Culture", "Science & Mathematics", "Health", "Education & Reference",
              "Computers & Internet", "Sports", "Business & Finance", "Entertainment & Music",
              "Family & Relationships", "Politics & Government"],
}
# what fdlit does to the source's inputs when it loads them, before the network (and its input step) sees them
AT_LOAD = {
    "digits": "pixels 0..16 divided by 16 when fdlit loads them (values in [0, 1]): feed "
              "sklearn.datasets.load_digits().images / 16, shape [N, 1, 8, 8]",
}


def class_names(dataset: str, num_classes: int) -> list[str]:
    """The names of a dataset's classes in label order (index i is label i); label numbers when unknown."""
    names = CLASS_NAMES.get(dataset)
    return list(names) if names is not None and len(names) == num_classes else [str(i) for i in range(num_classes)]


def at_load(dataset: str) -> str | None:
    """The preprocessing fdlit applies to a dataset's stored inputs when it loads them, or None."""
    return AT_LOAD.get(dataset)
