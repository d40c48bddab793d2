"""Co-execution passes: split, chain and place operators on GPU + CPU."""
