"""`mmc team …`: the teams you are in and what they own; members' roles (a team's admins),
creating and deleting teams (global admins), moving a model between two teams you administer.

    mmc team list
    mmc team show fraud
    mmc team create fraud --description "payments fraud models"
    mmc team set-role fraud alice engineer     # viewer, engineer, approver, admin
    mmc team remove fraud alice
    mmc team move fraud-clf fraud              # the model now belongs to fraud
    mmc team delete fraud                      # only once it owns no models
"""

from __future__ import annotations

from mmc import Client
from registry.cli.output import print_json

ROLES = ("viewer", "engineer", "approver", "admin")


def cmd_team_list(c: Client, a) -> int:
    for t in c.list_teams():
        print(f"{t.name:24} role={t.your_role or '-':9} models={len(t.models):<4} "
              f"members={len(t.members)}")
    return 0


def cmd_team_show(c: Client, a) -> int:
    print_json(c.get_team(a.team).raw)
    return 0


def cmd_team_create(c: Client, a) -> int:
    print_json(c.create_team(a.team, description=a.description).raw)
    return 0


def cmd_team_delete(c: Client, a) -> int:
    c.delete_team(a.team)
    print(f"team {a.team} deleted")
    return 0


def cmd_team_set_role(c: Client, a) -> int:
    m = c.set_team_member(a.team, a.username, a.role)
    print(f"{m.username} is {m.role} in {a.team}")
    return 0


def cmd_team_remove(c: Client, a) -> int:
    c.remove_team_member(a.team, a.username)
    print(f"{a.username} removed from {a.team}")
    return 0


def cmd_team_move(c: Client, a) -> int:
    m = c.move_model(a.model, a.team)
    print(f"{m.name} now belongs to {m.team}")
    return 0


def team_parsers(sub) -> None:
    team = sub.add_parser("team", help="teams: list, show, create, members' roles, move a model")
    ops = team.add_subparsers(dest="team_command", required=True, metavar="COMMAND")
    s = ops.add_parser("list", help="the teams you hold a role in")
    s.set_defaults(fn=cmd_team_list)
    s = ops.add_parser("show", help="a team's models and members (JSON)")
    s.add_argument("team")
    s.set_defaults(fn=cmd_team_show)
    s = ops.add_parser("create", help="create a team (global admins)")
    s.add_argument("team")
    s.add_argument("--description", default="")
    s.set_defaults(fn=cmd_team_create)
    s = ops.add_parser("delete", help="delete a team that owns no models (global admins)")
    s.add_argument("team")
    s.set_defaults(fn=cmd_team_delete)
    s = ops.add_parser("set-role", help="give a user a role in the team (its admins)")
    s.add_argument("team")
    s.add_argument("username")
    s.add_argument("role", choices=ROLES)
    s.set_defaults(fn=cmd_team_set_role)
    s = ops.add_parser("remove", help="take a user out of the team (its admins)")
    s.add_argument("team")
    s.add_argument("username")
    s.set_defaults(fn=cmd_team_remove)
    s = ops.add_parser("move", help="give a model to the team (admin in both teams)")
    s.add_argument("model")
    s.add_argument("team")
    s.set_defaults(fn=cmd_team_move)
