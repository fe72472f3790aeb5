"""Applications built on the library: the `minibert` command and the demo. The library never imports them."""
