from rest_framework.permissions import SAFE_METHODS, BasePermission

from registry.roles import has_role


class RolePermission(BasePermission):
    """Reads need `read_role`, writes `write_role` (view attributes; viewer / engineer)."""

    message = "your role does not allow this"

    def has_permission(self, request, view) -> bool:
        if request.method in SAFE_METHODS:
            needed = getattr(view, "read_role", "viewer")
        else:
            needed = getattr(view, "write_role", "engineer")
        if not has_role(request.user, needed):
            self.message = f"this needs the {needed} role"
            return False
        return True


IsViewer = RolePermission
