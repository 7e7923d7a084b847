import argparse
import sys

from . import train


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m miniengine")
    sub = parser.add_subparsers(dest="command", required=True)
    train.add_arguments(sub.add_parser("train", help="train a tiny Llama on the Python standard library"))
    args = parser.parse_args(argv)
    if args.command == "train":
        train.train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
