-- After a charge has been stored: the decision part that follows figures
-- out a call of cost 1 on the charged state (lua/common/standing.lua then
-- reports it as the figures of now).
cost = 1
