from datetime import timedelta

from django.core.management.base import BaseCommand

from registry.store.gc import collect_garbage


class Command(BaseCommand):
    help = "Remove artifact blobs no version references (and stale temp files)."

    def add_arguments(self, parser):
        parser.add_argument("--dry-run", action="store_true")
        parser.add_argument("--grace-minutes", type=float, default=60)

    def handle(self, *args, dry_run, grace_minutes, **options):
        result = collect_garbage(grace=timedelta(minutes=grace_minutes), dry_run=dry_run)
        verb = "would remove" if dry_run else "removed"
        self.stdout.write(f"{verb} {len(result['blobs'])} blob(s), {result['temp_files']} temp "
                          f"file(s), {result['bytes']} bytes")
