"""Teams over the API: list and read the teams you belong to, create and delete them (global
admins), set members' roles (the team's admins), move a model to another team."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from registry import roles
from registry.api.parsers import JSONParser
from registry.api.serializers import ModelSerializer
from registry.audit import Actor
from registry.models import Team
from registry.selectors import model_get
from registry.services import teams as svc


class MemberSerializer(serializers.Serializer):
    username = serializers.CharField()
    role = serializers.CharField(help_text="viewer, engineer, approver or admin")
    source = serializers.CharField(help_text="'sso' when the identity provider's groups set it")


class TeamSerializer(serializers.Serializer):
    name = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    created_at = serializers.DateTimeField()
    models = serializers.ListField(child=serializers.CharField(),
                                   help_text="names of the models the team owns")
    members = MemberSerializer(many=True)
    your_role = serializers.CharField(allow_null=True)


class TeamCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=64)
    description = serializers.CharField(required=False, allow_blank=True, default="")


class RoleSerializer(serializers.Serializer):
    role = serializers.ChoiceField(choices=roles.TEAM_ROLES)


class MoveSerializer(serializers.Serializer):
    team = serializers.CharField(max_length=64, help_text="the team that will own the model")


def _valid(serializer_class, data) -> dict:
    ser = serializer_class(data=data)
    ser.is_valid(raise_exception=True)
    return ser.validated_data


def _doc(team: Team, user) -> dict:
    return {"name": team.name, "description": team.description, "created_at": team.created_at,
            "models": list(team.models.order_by("name").values_list("name", flat=True)),
            "members": [{"username": m.user.get_username(), "role": m.role, "source": m.source}
                        for m in team.memberships.select_related("user")],
            "your_role": roles.team_role(user, team.pk)}


class TeamListView(APIView):
    read_role = "viewer"
    write_role = "admin"
    parser_classes = [JSONParser]

    @extend_schema(responses=TeamSerializer(many=True))
    def get(self, request):
        """The teams you hold a role in (every team for a global admin)."""
        ids = roles.teams_where(request.user)
        rows = Team.objects.all() if ids is None else Team.objects.filter(pk__in=ids)
        return Response(TeamSerializer([_doc(t, request.user) for t in rows], many=True).data)

    @extend_schema(request=TeamCreateSerializer, responses={201: TeamSerializer})
    def post(self, request):
        """Create a team (global admins)."""
        data = _valid(TeamCreateSerializer, request.data)
        team = svc.team_create(actor=Actor.from_request(request), **data)
        return Response(TeamSerializer(_doc(team, request.user)).data,
                        status=status.HTTP_201_CREATED)


class TeamDetailView(APIView):
    read_role = "viewer"
    write_role = "admin"

    @extend_schema(responses=TeamSerializer)
    def get(self, request, team):
        return Response(TeamSerializer(_doc(svc.visible_team(request.user, team),
                                            request.user)).data)

    @extend_schema(responses={204: None})
    def delete(self, request, team):
        """Delete a team that owns no models (global admins)."""
        svc.visible_team(request.user, team)
        svc.team_delete(name=team, actor=Actor.from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class TeamMemberView(APIView):
    # the team's own admins may: the service checks the role held in that team
    read_role = write_role = "viewer"
    parser_classes = [JSONParser]

    @extend_schema(request=RoleSerializer, responses=MemberSerializer)
    def put(self, request, team, username):
        """Give `username` a role in the team (its admins, or a global admin)."""
        data = _valid(RoleSerializer, request.data)
        m = svc.member_set(team=team, username=username, role=data["role"],
                           actor=Actor.from_request(request))
        return Response(MemberSerializer({"username": username, "role": m.role,
                                          "source": m.source}).data)

    @extend_schema(responses={204: None})
    def delete(self, request, team, username):
        svc.member_remove(team=team, username=username, actor=Actor.from_request(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class ModelTeamView(APIView):
    write_role = "admin"  # in the team that owns the model (RolePermission); the service
    parser_classes = [JSONParser]  # checks admin in the receiving team too

    @extend_schema(request=MoveSerializer, responses=ModelSerializer)
    def put(self, request, name):
        """Move the model to another team: admin in both teams."""
        data = _valid(MoveSerializer, request.data)
        svc.model_move(name=name, team=data["team"], actor=Actor.from_request(request))
        return Response(ModelSerializer(model_get(name)).data)
