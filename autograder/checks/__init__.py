"""The helpers behind the labs' test cells, one concern per module; :mod:`autograder.notebook_checks` gathers them."""
