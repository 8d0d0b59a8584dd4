from rest_framework.permissions import SAFE_METHODS, BasePermission

from registry.roles import has_role, require_model

READ_ONLY_REFUSAL = ("this API token has the read-only scope: it may only read (GET, HEAD, "
                     "OPTIONS); create a token without read-only to make changes")


class RolePermission(BasePermission):
    """The API's default permission: reads need the view's `read_role` (default viewer), writes
    its `write_role` (default engineer); a view raises either by setting the attribute. On a
    model's routes (`models/<name>/…`) the role is the one held in the team owning the model
    (registry.roles), and a model of another team is answered as one that does not exist. A
    read-only token never writes, whatever its user's role."""

    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", "viewer")
        else:
            if getattr(request.auth, "read_only", False):
                self.message = READ_ONLY_REFUSAL
                return False
            needed = getattr(view, "write_role", "engineer")
        if not request.user or not request.user.is_authenticated:
            return False
        if not has_role(request.user, "viewer"):
            self.message = "you hold no role (globally or in a team): ask an admin for one"
            return False
        name = getattr(view, "kwargs", {}).get("name")
        if name is not None and require_model(request.user, name, needed):
            return True
        if not has_role(request.user, needed):
            self.message = f"this needs the {needed} role"
            return False
        return True
