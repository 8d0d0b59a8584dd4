"""Teams: the teams you hold a role in, their members and models; creating and deleting one
(global admins), members' roles (the team's admins), moving a model (admin in both teams)."""

from __future__ import annotations

from mmc.resources import Model, Team, TeamMember
from mmc.transport import Transport


class Teams(Transport):
    def list_teams(self) -> list[Team]:
        """The teams you hold a role in (every team for a global admin)."""
        return [Team.of(t) for t in self._pages("teams/")]

    def get_team(self, team: str) -> Team:
        return Team.of(self._call("GET", f"teams/{team}/"))

    def create_team(self, name: str, *, description: str = "") -> Team:
        """A new team, with no members and no models (global admins)."""
        return Team.of(self._call("POST", "teams/", json={"name": name,
                                                          "description": description}))

    def delete_team(self, team: str) -> None:
        """Delete a team that owns no models (global admins)."""
        self._call("DELETE", f"teams/{team}/")

    def set_team_member(self, team: str, username: str, role: str) -> TeamMember:
        """Give `username` the role viewer, engineer, approver or admin in `team`."""
        return TeamMember.of(self._call("PUT", f"teams/{team}/members/{username}/",
                                        json={"role": role}))

    def remove_team_member(self, team: str, username: str) -> None:
        self._call("DELETE", f"teams/{team}/members/{username}/")

    def move_model(self, name: str, team: str) -> Model:
        """Give the model to `team` (admin in its team and in `team`)."""
        return Model.of(self._call("PUT", f"models/{name}/team/", json={"team": team}))
