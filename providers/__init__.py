"""Cloud providers behind spotrun's own small protocol, installed as `spotrun.providers`."""
