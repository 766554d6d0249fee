"""Endpoints: declared inputs/outputs (bound by name) and the auto-update policy.

Revision ID: 0002
Revises: 0001
"""
from alembic import op
import sqlalchemy as sa


revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('endpoints', schema=None) as batch_op:
        batch_op.add_column(sa.Column('io', sa.JSON(), nullable=False, server_default='{}'))
        batch_op.add_column(sa.Column('auto_update', sa.JSON(), nullable=False, server_default='{}'))


def downgrade() -> None:
    with op.batch_alter_table('endpoints', schema=None) as batch_op:
        batch_op.drop_column('auto_update')
        batch_op.drop_column('io')
