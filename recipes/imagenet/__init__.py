"""ImageNet (ILSVRC2012) in ImageFolder layout: recipe=imagenet and the adpsgd-imagenet tool."""
