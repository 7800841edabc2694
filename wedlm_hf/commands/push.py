"""Upload a folder written by `wedlm-hf export` to a Hub repository."""

import argparse


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="folder written by `wedlm-hf export`")
    parser.add_argument("--repo-id", required=True, help="target repository, e.g. user/WeDLM-8B-Base")
    parser.add_argument("--private", action="store_true", help="create the repository as private")
    parser.add_argument("--commit-message", default=None)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..hub.push import push_folder

    print(push_folder(args.directory, args.repo_id, private=args.private, commit_message=args.commit_message))
    return 0
